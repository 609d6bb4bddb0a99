"""The OpenAI wire format of vLLM's server, for the HTTP simulator: request parsing, errors, SSE chunks.

Kept apart from the engine loop (`tuner.sim.server`) so the loop reads as scheduling and nothing else.
What matters to clients, and is therefore copied from vLLM rather than simplified:

- Token counts: the prompt is tokenised with the server's `tuner.tokens.TokenCounter` (the model's
  tokenizer.json when it is local, else the estimate). Chat messages go through a small ChatML template
  first and are then encoded without the tokenizer's special tokens, as vLLM encodes a rendered chat
  template; the model's own `chat_template` is not applied (no Jinja here), so the count is exact for
  ChatML models (Qwen, the CI tiny model) and a few tokens per message off for others. Exactly
  `max_tokens` tokens come back, one word per token and one SSE event per token, so a client counting
  chunks counts tokens. The simulator never emits EOS, so `min_tokens` and `ignore_eos` change nothing; `max_tokens` defaults to
  16 for both endpoints (vLLM's chat default is "the rest of the context", which a model that never stops
  would take literally).
- Errors: vLLM's status codes and messages (400 for a context overflow, with `EngineCore.check`'s text;
  404 for an unknown model; 401 `{"error": "Unauthorized"}` from the API-key middleware).
- Streams: `data: {...}` events, the last token's chunk carrying `finish_reason: "length"`, a usage chunk
  with empty `choices` when `stream_options.include_usage`, then `data: [DONE]`.

Chunks are rendered from per-request byte templates: on a 2-core machine JSON-encoding every token's
chunk from a dict would cost more than the scheduling it reports. The streaming helpers at the end wait on
a `tuner.sim.server.SimRequest` (its `tokens`, `done` and `event`), duck-typed to keep this module free of
the engine loop.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass

from starlette.responses import StreamingResponse

from tuner.tokens import RegexCounter, TokenCounter

DEFAULT_MAX_TOKENS = 16
DONE = b"data: [DONE]\n\n"
# Output words: plain ASCII (no JSON escaping needed), one simulator token each (" the" is one pre-token).
WORDS = tuple(" " + w for w in (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "had they you were their one all we can her has there been if more when will would who so no she other "
    "its time people year way day man thing woman life child world school state family student group").split())


class BadRequest(Exception):
    """A request vLLM would refuse; `body()` is vLLM's error JSON."""

    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError",
                 param: str | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.err_type = err_type
        self.param = param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param,
                          "code": self.status}}


UNAUTHORIZED = {"error": "Unauthorized"}


@dataclass(slots=True)
class ParsedRequest:
    chat: bool
    model: str
    prompt_ids: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool


def render_chat(messages: list, generation_prompt: bool = True) -> str:
    """The prompt text of a chat request: a ChatML-like template (what Qwen's chat template renders).
    A shared system prompt therefore renders to the same leading tokens, and hits the prefix cache.
    `generation_prompt`: end with the assistant turn's opening (vLLM's `add_generation_prompt`)."""
    parts = []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise BadRequest("each message must be an object with a 'role'", param="messages")
        content = m.get("content") or ""
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"<|im_start|>{m['role']}\n{content}<|im_end|>\n")
    return "".join(parts) + ("<|im_start|>assistant\n" if generation_prompt else "")


def _int_field(body: dict, name: str, default: int | None) -> int | None:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"{name} must be an integer, got {v!r}", param=name)
    return v


def json_object(raw: bytes) -> dict:
    """A request body as a JSON object, or the 400 vLLM gives for anything else."""
    try:
        body = json.loads(raw or b"{}")
    except ValueError as e:
        raise BadRequest(f"Invalid JSON in request body: {e}") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def served_model(body: dict, served: tuple[str, ...]) -> str:
    """The request's `model` (default: the first served name), or vLLM's 404 for one it does not serve."""
    model = body.get("model") or served[0]
    if model not in served:
        raise BadRequest(f"The model `{model}` does not exist.", status=404, err_type="NotFoundError",
                         param="model")
    return model


def parse_request(raw: bytes, *, chat: bool, served: tuple[str, ...],
                  tokens: TokenCounter | None = None) -> ParsedRequest:
    """Validate a `/v1/completions` or `/v1/chat/completions` body; raise `BadRequest` as vLLM would."""
    tokens = tokens or RegexCounter()
    body = json_object(raw)
    model = served_model(body, served)
    if _int_field(body, "n", 1) != 1:
        raise BadRequest("the simulator serves n=1 only", param="n")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list", param="messages")
        ids = tokens.ids(render_chat(messages), special_tokens=False)
        name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        max_tokens = _int_field(body, name, DEFAULT_MAX_TOKENS)
    else:
        ids = _prompt_ids(body.get("prompt"), tokens)
        max_tokens = _int_field(body, "max_tokens", DEFAULT_MAX_TOKENS)
    if max_tokens < 1:
        raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens")
    if not ids:
        raise BadRequest("The prompt is empty.", param="prompt")
    stream = bool(body.get("stream", False))
    opts = body.get("stream_options") or {}
    if opts and not stream:
        raise BadRequest("Stream options can only be defined when `stream=True`.", param="stream_options")
    return ParsedRequest(chat=chat, model=model, prompt_ids=ids, max_tokens=max_tokens, stream=stream,
                         include_usage=bool(opts.get("include_usage")))


def _prompt_ids(prompt, tokens: TokenCounter) -> list[int]:
    """Token ids of a completions prompt: text, token ids, or a one-element list of either."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokens.ids(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    raise BadRequest("prompt must be a string, a list of token ids, or a one-element list of either "
                     "(batched prompts are not simulated)", param="prompt")


class Renderer:
    """Response bytes for one request, built from templates made once per request."""

    __slots__ = ("chat", "rid", "created", "model_json", "_head", "_tail", "_last_tail")

    def __init__(self, chat: bool, model: str):
        self.chat = chat
        self.rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.model_json = json.dumps(model)
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._head = (f'data: {{"id":"{self.rid}","object":"{obj}","created":{self.created},'
                      f'"model":{self.model_json},"choices":[{{"index":0,').encode()
        if chat:
            self._tail = b'"},"logprobs":null,"finish_reason":null}]}\n\n'
            self._last_tail = b'"},"logprobs":null,"finish_reason":"length"}]}\n\n'
        else:
            self._tail = b'","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
            self._last_tail = b'","logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n'

    def role_event(self) -> bytes:
        """The chat stream's first chunk (role only, no content), sent with the first token as vLLM does."""
        return (self._head
                + b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n')

    def token_events(self, start: int, stop: int, total: int) -> bytes:
        """SSE events for output tokens start..stop-1 (one event each) of a `total`-token completion."""
        field = b'"delta":{"content":"' if self.chat else b'"text":"'
        head = self._head + field
        out = []
        for i in range(start, stop):
            out.append(head + WORDS[i % len(WORDS)].encode()
                       + (self._last_tail if i == total - 1 else self._tail))
        return b"".join(out)

    def usage_event(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return (f'data: {{"id":"{self.rid}","object":"{obj}","created":{self.created},'
                f'"model":{self.model_json},"choices":[],"usage":{{"prompt_tokens":{prompt_tokens},'
                f'"total_tokens":{prompt_tokens + completion_tokens},'
                f'"completion_tokens":{completion_tokens}}}}}\n\n').encode()

    def full(self, prompt_tokens: int, completion_tokens: int) -> dict:
        """The non-streamed response body."""
        text = "".join(WORDS[i % len(WORDS)] for i in range(completion_tokens))
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": "length", "stop_reason": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length",
                      "stop_reason": None}
        return {"id": self.rid, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": json.loads(self.model_json), "choices": [choice],
                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
                          "completion_tokens": completion_tokens}}


# --- streaming plumbing ---------------------------------------------------------------------------
class WatchedStream(StreamingResponse):
    """A streaming response that notices a client leaving even while it has nothing to send.

    Under an ASGI 2.4 server Starlette learns of a disconnect only when a write fails, but a queued request
    writes nothing until its first token, and the engine must drop it as soon as its client is gone. So
    the disconnect is always watched, whatever the server's ASGI version.
    """

    async def __call__(self, scope, receive, send) -> None:
        stream = asyncio.ensure_future(self.stream_response(send))
        watch = asyncio.ensure_future(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait((stream, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (stream, watch):
                task.cancel()
            results = await asyncio.gather(stream, watch, return_exceptions=True)
            # a generator cancelled in the middle of a write never reached its `finally`: close it now
            await self.body_iterator.aclose()  # type: ignore[attr-defined]  # an async generator here
        err = results[0]
        if isinstance(err, BaseException) and not isinstance(err, (asyncio.CancelledError, OSError)):
            raise err


async def wait_done_or_gone(req, receive) -> bool:
    """Wait for a non-streamed request to finish; False if the client disconnected first."""
    async def gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(gone())
    try:
        while not req.done:
            waiter = asyncio.ensure_future(req.event.wait())
            await asyncio.wait((waiter, watch), return_when=asyncio.FIRST_COMPLETED)
            if watch.done():
                waiter.cancel()
                return req.done
            req.event.clear()
        return True
    finally:
        watch.cancel()


async def sse_body(loop, req, p: ParsedRequest, out: Renderer):
    """The SSE body: one event per token as the engine delivers them; aborts the request if cancelled."""
    total = p.max_tokens
    sent = 0
    try:
        while sent < total:
            await req.event.wait()
            req.event.clear()
            n = req.tokens
            if n > sent:
                chunk = out.token_events(sent, n, total)
                if sent == 0 and out.chat:
                    chunk = out.role_event() + chunk
                sent = n
                if sent >= total:
                    break
                yield chunk
        tail = chunk
        if p.include_usage:
            tail += out.usage_event(len(p.prompt_ids), total)
        yield tail + b"data: [DONE]\n\n"
    finally:
        loop.abort(req)  # a no-op once the request finished
