"""Send one streaming OpenAI request and time it into a `RequestRecord`.

Timing rules (the ones vLLM's `bench serve` uses, so numbers compare):

- `sent_s` is taken just before the request is handed to httpx; TTFT therefore includes connection setup
  and the client's own overhead, as a real user's would.
- A *token event* is a streamed chunk whose choice carries non-empty text (`text` for completions,
  `delta.content` for chat; the chat role-only first chunk is not a token). Its time is the arrival of the
  network read that carried it, so events that arrived together share a time. `token_times` holds one
  entry per token event: when the server packs several tokens into a chunk, ITLs are per chunk, as in
  `bench serve`.
- `output_tokens` is the usage block's `completion_tokens` when the server sends one (we ask for it with
  `stream_options.include_usage`), else the number of token events. `finish_s` is when `[DONE]` arrived.

Anything that is not a complete stream is an error, so it can never count as good: HTTP status >= 400, an
`error` object in the stream, a connection that drops before `[DONE]`, no data for `stall_timeout_s`
(between chunks, or before headers), or more than `request_timeout_s` in total.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Callable

import httpx

from tuner.replay.record import RequestRecord


def _text_of(choice: dict) -> str:
    text = choice.get("text")
    if text is None:
        delta = choice.get("delta") or {}
        text = delta.get("content") or delta.get("reasoning_content") or ""
    return text


def build_request(url: str, body: bytes, headers: dict[str, str], *, stall_timeout_s: float) -> httpx.Request:
    """The request, built ahead of its send time so that the send itself does as little as possible.

    `stall_timeout_s` (real seconds) bounds every wait for the network: connect, write, and each read.
    """
    return httpx.Request("POST", url, content=body, headers=headers,
                         extensions={"timeout": httpx.Timeout(stall_timeout_s).as_dict()})


async def stream_request(transport: httpx.AsyncBaseTransport, request: httpx.Request, rec: RequestRecord,
                         clock: Callable[[float], float], *, request_timeout_s: float,
                         stall_timeout_s: float) -> None:
    """Send `request` now and fill `rec` in place. `clock` maps `time.monotonic()` to the run's (scaled)
    seconds.

    Timeouts are real seconds (the caller scales them). Never raises except on cancellation, which
    leaves `rec` as measured so far for the caller to mark.
    """
    times: list[float] = []
    rec.token_times = times
    chunks = 0
    usage: dict | None = None
    done = False
    finish_reason = None
    rec.sent_s = clock(time.monotonic())
    try:
        async with asyncio.timeout(request_timeout_s):
            resp = await transport.handle_async_request(request)
            resp.request = request
            try:
                if resp.status_code >= 400:
                    detail = (await resp.aread())[:300].decode("utf-8", "replace")
                    rec.error = f"HTTP {resp.status_code}: {detail}"
                    return
                buf = b""
                async for data in resp.aiter_bytes():
                    now = clock(time.monotonic())
                    buf += data
                    if b"\r" in buf:  # SSE allows CRLF line ends; a CR split from its LF waits a read
                        buf = buf.replace(b"\r\n", b"\n")
                    if b"\n\n" not in buf:
                        continue
                    *events, buf = buf.split(b"\n\n")
                    for event in events:
                        for line in event.split(b"\n"):
                            if not line.startswith(b"data:"):
                                continue
                            payload = line[5:].strip()
                            if payload == b"[DONE]":
                                done = True
                                rec.finish_s = now
                                continue
                            obj = json.loads(payload)
                            if obj.get("error") or obj.get("object") == "error":
                                err = obj.get("error") or obj
                                msg = err.get("message", err) if isinstance(err, dict) else err
                                rec.error = f"server error in stream: {msg}"
                                return
                            if obj.get("usage"):
                                usage = obj["usage"]
                            for choice in obj.get("choices") or ():
                                if _text_of(choice):
                                    if rec.first_token_s is None:
                                        rec.first_token_s = now
                                    times.append(now)
                                    chunks += 1
                                finish_reason = choice.get("finish_reason") or finish_reason
            finally:
                await resp.aclose()
        if not done:
            rec.error = ("stream ended before [DONE]" if finish_reason is None
                         else f"stream ended before [DONE] (finish_reason={finish_reason})")
    except TimeoutError:
        rec.error = f"timeout: no complete response in {request_timeout_s:g}s"
    except (httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout, httpx.ConnectTimeout):
        rec.error = f"stalled: no data for {stall_timeout_s:g}s"
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as e:
        rec.error = f"connection dropped: {e or type(e).__name__}"
    except httpx.HTTPError as e:
        rec.error = f"{type(e).__name__}: {e}"
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        rec.error = f"bad stream data: {e}"
    finally:
        if usage is not None:
            rec.output_tokens = int(usage.get("completion_tokens") or chunks)
            if usage.get("prompt_tokens") is not None:
                rec.prompt_tokens = int(usage["prompt_tokens"])
        else:
            rec.output_tokens = chunks
    if rec.error is None and rec.first_token_s is None:
        rec.error = "no tokens in a complete stream"
    rec.end_s = clock(time.monotonic()) if rec.finish_s is None else rec.finish_s
