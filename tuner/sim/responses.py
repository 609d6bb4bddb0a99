"""`POST /v1/responses` of the HTTP simulator: the OpenAI Responses API as vLLM 0.32 serves it (non-harmony).

Real vLLM serves it and clients use it (`vllm bench serve --backend openai-responses`), so the simulator
does too. Copied from vLLM's `entrypoints/openai/responses` (`serving.py`, `streaming_events.py`,
`api_router.py`, `utils.construct_input_messages`), as far as a client can see:

- Request: `input` is a string (one user message) or a list of messages (`{"role", "content"}` with
  string content or `[{"type": "input_text", "text": ...}]`); `instructions` becomes a leading system
  message; the messages are rendered through the same chat template as `/v1/chat/completions`.
  `max_output_tokens` caps the output (the simulator's default is 16, as for the other endpoints: vLLM's
  "the rest of the context" would be taken literally by a model that never stops).
- Response: `{"id": "resp_...", "object": "response", "status", "output": [one assistant message with one
  output_text part], "usage": {"input_tokens", "output_tokens", "total_tokens", ...}}`. The simulator
  always stops at the length cap, so `status` is "incomplete" with `incomplete_details.reason`
  "max_output_tokens", exactly what vLLM says of a request that ran into `max_output_tokens`.
- Stream (`"stream": true`): SSE messages `event: <type>\\ndata: <json>\\n\\n`, no `[DONE]`:
  `response.created`, `response.in_progress`; with the first token `response.output_item.added` and
  `response.content_part.added`; one `response.output_text.delta` per token; at the end
  `response.output_text.done`, `response.content_part.done`, `response.output_item.done` and
  `response.completed` carrying the full response with its usage. `sequence_number` counts from 0.
"""

from __future__ import annotations

import json
import time
import uuid

from tuner.sim.protocol import (DEFAULT_MAX_TOKENS, WORDS, BadRequest, ParsedRequest, WatchedStream, json_object,
                                parse_request, wait_done_or_gone)


def to_chat_body(raw: bytes) -> tuple[dict, bytes]:
    """The Responses body, and the equivalent chat-completions body `parse_request` validates."""
    body = json_object(raw)
    inp = body.get("input")
    if isinstance(inp, str):
        messages = [{"role": "user", "content": inp}]
    elif isinstance(inp, list) and inp:
        messages = []
        for item in inp:
            if not isinstance(item, dict) or "role" not in item:
                raise BadRequest("each input item must be a message with a 'role' (tools are not simulated)",
                                 param="input")
            messages.append({"role": item["role"], "content": item.get("content") or ""})
    else:
        raise BadRequest("input must be a string or a non-empty list of messages", param="input")
    instructions = body.get("instructions")
    if instructions:
        messages.insert(0, {"role": "system", "content": str(instructions)})
    chat = {"model": body.get("model"), "messages": messages, "stream": bool(body.get("stream", False)),
            "max_tokens": body.get("max_output_tokens", DEFAULT_MAX_TOKENS)}
    if body.get("max_output_tokens") is None:
        chat["max_tokens"] = DEFAULT_MAX_TOKENS
    return body, json.dumps(chat).encode()


def parse_responses(raw: bytes, *, served: tuple[str, ...], **parse_options) -> tuple[dict, ParsedRequest]:
    """Validate a `/v1/responses` body (raise `BadRequest` as vLLM would); `parse_options` go to
    `parse_request` (the server's token counter)."""
    body, chat = to_chat_body(raw)
    try:
        return body, parse_request(chat, chat=True, served=served, **parse_options)
    except BadRequest as e:
        if e.param == "max_tokens":  # name the field the client wrote
            raise BadRequest(e.message.replace("max_tokens", "max_output_tokens"), e.status, e.err_type,
                             "max_output_tokens") from None
        raise


class ResponsesRenderer:
    """The bytes of one response: events for a stream, the object for a plain response."""

    def __init__(self, body: dict, model: str, max_tokens: int):
        self.rid = "resp_" + uuid.uuid4().hex
        self.msg_id = "msg_" + uuid.uuid4().hex
        self.created = int(time.time())
        self.model, self.max_tokens = model, max_tokens
        self.instructions = body.get("instructions")
        self.seq = 0

    def _event(self, kind: str, **fields) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()

    def _text(self, n: int) -> str:
        return "".join(WORDS[i % len(WORDS)] for i in range(n))

    def _message(self, text: str, status: str) -> dict:
        return {"id": self.msg_id, "type": "message", "role": "assistant", "status": status,
                "content": [] if status == "in_progress" else [self._part(text)]}

    @staticmethod
    def _part(text: str) -> dict:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def response(self, prompt_tokens: int | None, completion_tokens: int | None) -> dict:
        """The response object; without token counts it is the in-progress one of `response.created`."""
        done = completion_tokens is not None
        usage = None
        if done:
            usage = {"input_tokens": prompt_tokens, "output_tokens": completion_tokens,
                     "total_tokens": (prompt_tokens or 0) + completion_tokens,
                     "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                     "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0}}
        return {"id": self.rid, "created_at": self.created, "object": "response", "model": self.model,
                "status": "incomplete" if done else "in_progress",
                "incomplete_details": {"reason": "max_output_tokens"} if done else None,
                "instructions": self.instructions, "metadata": None,
                "output": [self._message(self._text(completion_tokens), "completed")] if done else [],
                "parallel_tool_calls": True, "temperature": 1.0, "tool_choice": "auto", "tools": [],
                "top_p": 1.0, "background": False, "max_output_tokens": self.max_tokens,
                "service_tier": "auto", "truncation": "disabled", "usage": usage, "user": None}

    def start_events(self) -> bytes:
        r = self.response(None, None)
        return self._event("response.created", response=r) + self._event("response.in_progress", response=r)

    def token_events(self, start: int, stop: int) -> bytes:
        out = []
        if start == 0 and stop > 0:
            out.append(self._event("response.output_item.added", output_index=0,
                                   item=self._message("", "in_progress")))
            out.append(self._event("response.content_part.added", output_index=0, item_id=self.msg_id,
                                   content_index=0, part=self._part("")))
        for i in range(start, stop):
            out.append(self._event("response.output_text.delta", output_index=0, item_id=self.msg_id,
                                   content_index=0, delta=WORDS[i % len(WORDS)], logprobs=[]))
        return b"".join(out)

    def end_events(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        text = self._text(completion_tokens)
        common = {"output_index": 0, "item_id": self.msg_id}
        return (self._event("response.output_text.done", **common, content_index=0, text=text, logprobs=[])
                + self._event("response.content_part.done", **common, content_index=0, part=self._part(text))
                + self._event("response.output_item.done", output_index=0,
                              item=self._message(text, "completed"))
                + self._event("response.completed", response=self.response(prompt_tokens, completion_tokens)))


async def responses_sse_body(loop, req, p: ParsedRequest, out: ResponsesRenderer):
    """The Responses stream: one delta event per token as the engine delivers them; aborts if cancelled."""
    total, sent = p.max_tokens, 0
    try:
        yield out.start_events()
        while sent < total:
            await req.event.wait()
            req.event.clear()
            n = req.tokens
            if n > sent:
                chunk = out.token_events(sent, n)
                sent = n
                if sent >= total:
                    yield chunk + out.end_events(len(p.prompt_ids), total)
                    return
                yield chunk
    finally:
        loop.abort(req)  # a no-op once the request finished


def responses_endpoint(loop, served: tuple[str, ...], unauthorized, **parse_options):
    """The `/v1/responses` handler over the server's engine loop (`tuner.sim.server.EngineLoop`);
    `unauthorized(request)` is the server's API-key check, `parse_options` go to `parse_request`."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    async def responses(request: Request) -> Response:
        denied = unauthorized(request)
        if denied:
            return denied
        try:
            body, p = parse_responses(await request.body(), served=served, **parse_options)
            err = loop.check(len(p.prompt_ids), p.max_tokens)
            if err:
                raise BadRequest(err)
        except BadRequest as e:
            return JSONResponse(e.body(), status_code=e.status)
        req = loop.submit(p.prompt_ids, p.max_tokens, p.stream)
        out = ResponsesRenderer(body, p.model, p.max_tokens)
        if p.stream:
            return WatchedStream(responses_sse_body(loop, req, p, out), media_type="text/event-stream")
        if not await wait_done_or_gone(req, request.receive):
            loop.abort(req)
            return Response(status_code=499)
        return JSONResponse(out.response(len(p.prompt_ids), p.max_tokens))

    return responses
