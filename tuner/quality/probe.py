"""The requests the quality check sends to a launched server (vLLM's OpenAI completions API).

Two kinds, both greedy (`temperature: 0`) and non-streamed:

- an answer: `{"prompt": text or token ids, "max_tokens": N, "ignore_eos": true, "return_token_ids":
  true, "truncate_prompt_tokens": T}`; vLLM returns the prompt's token ids as it tokenized (and
  left-truncated) them in `choices[0].prompt_token_ids` and the answer's in `choices[0].token_ids`.
- teacher forcing: `{"prompt": prompt ids + answer ids, "max_tokens": 1, "prompt_logprobs": k}`; vLLM
  returns `choices[0].prompt_logprobs`, one entry per prompt token (the first null), each a mapping of
  token id -> `{"logprob", "rank", "decoded_token"}` holding the top k and the token actually there.
  `k` may not exceed the server's `--max-logprobs` (default 20): vLLM answers 400 "Requested prompt
  logprobs of K, which is greater than max allowed: M".

A server that cannot give these (an old vLLM, `--max-logprobs` below k, an API without the fields)
raises `NoLogprobs` with its words, once, and the study goes on without quality evidence.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

import httpx

T = TypeVar("T")
R = TypeVar("R")
WORKERS = 32         # requests in flight: the server batches them (prefill and decode), as under load
TIMEOUT_S = 300.0


class NoLogprobs(Exception):
    """The server does not answer the quality check's requests; the message says why, in its words."""


@dataclass
class Probe:
    """A launched server as the quality check talks to it."""

    base_url: str
    model: str | None
    headers: dict[str, str]
    top_k: int = 20

    def _post(self, client: httpx.Client, body: dict) -> dict:
        body = {"model": self.model, "temperature": 0, **body} if self.model else {"temperature": 0, **body}
        try:
            r = client.post(self.base_url + "/v1/completions", json=body, headers=self.headers)
        except httpx.HTTPError as e:
            raise NoLogprobs(f"the server did not answer: {type(e).__name__}: {e}") from None
        if r.status_code != 200:
            try:
                msg = r.json().get("error", {}).get("message") or r.text
            except ValueError:
                msg = r.text
            raise NoLogprobs(f"HTTP {r.status_code}: {str(msg)[:300]}")
        choices = r.json().get("choices") or [{}]
        return choices[0]

    def answer(self, client: httpx.Client, prompt: str | list[int], n: int,
               truncate: int | None = None) -> tuple[list[int], list[int], str]:
        """(prompt token ids as served, greedy answer token ids, answer text)."""
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": n, "ignore_eos": True, "return_token_ids": True}
        if truncate is not None:
            body["truncate_prompt_tokens"] = truncate
        c = self._post(client, body)
        ids, pids = c.get("token_ids"), c.get("prompt_token_ids")
        if ids is None or pids is None:
            raise NoLogprobs("the server returned no token ids (return_token_ids: vLLM >= 0.10.2)")
        return list(pids), list(ids), c.get("text") or ""

    def text_answer(self, client: httpx.Client, prompt: str, n: int) -> str:
        """The greedy answer's text (the task check), stopping where the model stops."""
        return self._post(client, {"prompt": prompt, "max_tokens": n}).get("text") or ""

    def forced(self, client: httpx.Client, prompt_ids: list[int], answer_ids: list[int]) -> list[dict[int, float]]:
        """The next-token log-probabilities (top k and the token there) at each answer position, the
        prompt and the baseline's answer fed in as one prompt."""
        c = self._post(client, {"prompt": prompt_ids + answer_ids, "max_tokens": 1, "prompt_logprobs": self.top_k})
        plp = c.get("prompt_logprobs")
        if not plp:
            raise NoLogprobs("the server returned no prompt_logprobs (vLLM's completions API has them; "
                             "check --max-logprobs)")
        start = len(prompt_ids)
        out = []
        for entry in plp[start:start + len(answer_ids)]:
            if not entry:
                raise NoLogprobs("a prompt_logprobs entry was empty")
            out.append({int(t): float(v["logprob"]) for t, v in entry.items()})
        if len(out) != len(answer_ids):
            raise NoLogprobs(f"prompt_logprobs had {len(plp)} entries for a {start + len(answer_ids)}-token prompt")
        return out


def parallel(fn: Callable[[httpx.Client, T], R], items: Sequence[T]) -> list[R]:
    """`fn(client, item)` for every item, `WORKERS` at a time, results in order; the first `NoLogprobs`
    (it would say the same for every item) or a Ctrl-C stops the rest without waiting for them."""
    pool = ThreadPoolExecutor(WORKERS)
    with httpx.Client(timeout=TIMEOUT_S, limits=httpx.Limits(max_connections=WORKERS)) as client:
        futures = [pool.submit(fn, client, it) for it in items]
        try:
            out = [f.result() for f in futures]
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    pool.shutdown()
    return out
