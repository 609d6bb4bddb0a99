"""What the HTTP simulator answers when asked for token ids and prompt log-probabilities.

The simulator has no model, so it has no quality to measure. It serves a deterministic stand-in, only so
that the quality check's pipeline (requests, storage, bound, report, gate) runs end to end on a laptop:
next-token logits are a pseudo-random function of the last two tokens, and each output-changing knob value
adds Gaussian noise of the standard deviation stated in `LOGIT_NOISE` (its profile: the divergence per
knob is a statement, not a measurement). Every result it leads to is labelled simulated.

The request and response shapes are vLLM 0.32's (`tuner.quality.probe`): `return_token_ids`,
`truncate_prompt_tokens`, `prompt_logprobs` up to `--max-logprobs` (default 20; above it a 400 with vLLM's
words), the entries `{"<id>": {"logprob", "rank", "decoded_token"}}` holding the top k and the token there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

VOCAB = 256           # the stand-in model's vocabulary: ids FIRST_ID .. FIRST_ID + VOCAB - 1
FIRST_ID = 100
LOGIT_SCALE = 2.0     # the stand-in's logits ~ N(0, LOGIT_SCALE^2): a few likely tokens per position
#: The simulator's stated divergence: the standard deviation (nats) of the noise each output-changing knob
#: value adds to every logit. `None` as value: any value of the knob. Lossless speculative decoding adds none.
LOGIT_NOISE: dict[tuple[str, object], float] = {
    ("kv_cache_dtype", "fp8"): 0.3, ("kv_cache_dtype", "fp8_e4m3"): 0.3, ("kv_cache_dtype", "fp8_e5m2"): 0.5,
    ("quantization", None): 0.8,
}
DEFAULT_MAX_LOGPROBS = 20


def logit_noise(kv_cache_dtype: str | None, quantization: str | None) -> float:
    """The stated noise of a configuration: the knobs' noises added in quadrature."""
    var = 0.0
    for knob, value in (("kv_cache_dtype", kv_cache_dtype), ("quantization", quantization)):
        if value in (None, "auto"):
            continue
        s = LOGIT_NOISE.get((knob, value), LOGIT_NOISE.get((knob, None), 0.0))
        var += s * s
    return math.sqrt(var)


M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _normals(keys: np.ndarray, salt: int) -> np.ndarray:
    """Standard normals, VOCAB per key, a pure function of (key, salt): splitmix64 of a counter, then
    Box-Muller. Vectorised, so a prompt's every position costs one array operation."""
    with np.errstate(over="ignore"):
        x = (keys.astype(np.uint64)[:, None] * np.uint64(0x9E3779B97F4A7C15)
             + np.arange(VOCAB, dtype=np.uint64)[None, :] * np.uint64(0xD1B54A32D192ED03)
             + np.uint64(salt * 0x2545F4914F6CDD1D & 0xFFFFFFFFFFFFFFFF))
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    u1 = ((x >> np.uint64(40)).astype(np.float64) + 0.5) / 2.0 ** 24
    u2 = ((x & np.uint64(0xFFFFFF)).astype(np.float64) + 0.5) / 2.0 ** 24
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def _keys(ctx: list[int]) -> np.ndarray:
    """One key per position i >= 2 of `ctx`: its two preceding tokens."""
    a = np.array(ctx[:-2], dtype=np.uint64) & np.uint64(0xFFFFFFFF)
    b = np.array(ctx[1:-1], dtype=np.uint64) & np.uint64(0xFFFFFFFF)
    return (a << np.uint64(32)) | b


@dataclass(frozen=True)
class StandIn:
    """The stand-in model of one launch."""

    noise: float = 0.0
    max_logprobs: int = DEFAULT_MAX_LOGPROBS

    def logprobs(self, keys: np.ndarray) -> np.ndarray:
        """Next-token log-probabilities, one row per context key."""
        logits = _normals(keys, 1) * LOGIT_SCALE
        if self.noise:
            logits = logits + _normals(keys, 2) * self.noise
        m = logits.max(axis=1, keepdims=True)
        return logits - (m + np.log(np.exp(logits - m).sum(axis=1, keepdims=True)))

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        ctx = [0, 0, *prompt]
        out = []
        for _ in range(n):
            t = FIRST_ID + int(np.argmax(self.logprobs(_keys(ctx[-2:] + [0]))[0]))
            out.append(t)
            ctx.append(t)
        return out

    def prompt_logprobs(self, prompt: list[int], k: int) -> list[dict | None]:
        """vLLM's `prompt_logprobs`: None for the first token, then the top k and the token there."""
        out: list[dict | None] = [None]
        if len(prompt) < 2:
            return out
        lps = self.logprobs(_keys([0, 0, *prompt]))[1:]   # row i-1: the distribution of prompt[i]
        tops = np.argsort(-lps, axis=1, kind="stable")[:, :k]
        for i in range(1, len(prompt)):
            lp = lps[i - 1]
            entry = {str(FIRST_ID + int(j)): {"logprob": float(lp[j]), "rank": r, "decoded_token": f"t{j}"}
                     for r, j in enumerate(tops[i - 1], 1)}
            there = prompt[i] - FIRST_ID
            if str(prompt[i]) not in entry:
                if 0 <= there < VOCAB:
                    rank = int((lp > lp[there]).sum()) + 1
                    entry[str(prompt[i])] = {"logprob": float(lp[there]), "rank": rank, "decoded_token": f"t{there}"}
                else:  # a prompt token outside the stand-in's vocabulary: as unlikely as its least token
                    entry[str(prompt[i])] = {"logprob": float(lp.min()) - 1.0, "rank": VOCAB,
                                             "decoded_token": ""}
            out.append(entry)
        return out

    def extra_fields(self, body: dict, prompt_ids: list[int], max_tokens: int) -> dict:
        """The choice's fields a non-streamed completion adds when the request asks for them."""
        extra: dict = {}
        if body.get("return_token_ids"):
            extra["prompt_token_ids"] = prompt_ids
            extra["token_ids"] = self.greedy(prompt_ids, max_tokens)
        k = body.get("prompt_logprobs")
        if isinstance(k, int) and not isinstance(k, bool) and k > 0:
            extra["prompt_logprobs"] = self.prompt_logprobs(prompt_ids, k)
        return extra

    def refusal(self, body: dict) -> str | None:
        """vLLM's 400 for prompt logprobs above `--max-logprobs`, or None."""
        k = body.get("prompt_logprobs")
        if isinstance(k, int) and not isinstance(k, bool) and k > self.max_logprobs:
            return f"Requested prompt logprobs of {k}, which is greater than max allowed: {self.max_logprobs}"
        return None


def truncate(body: dict, prompt_ids: list[int]) -> list[int]:
    """`truncate_prompt_tokens`: keep the prompt's last k tokens (vLLM truncates from the left)."""
    k = body.get("truncate_prompt_tokens")
    if isinstance(k, int) and not isinstance(k, bool) and 0 < k < len(prompt_ids):
        return prompt_ids[-k:]
    return prompt_ids
