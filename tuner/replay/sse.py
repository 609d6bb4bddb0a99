"""Send one streaming OpenAI request and time it into a `RequestRecord`.

Timing rules (the ones vLLM's `bench serve` uses, so numbers compare):

- `sent_s` is taken just before the request is handed to aiohttp; TTFT therefore includes connection setup
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

import aiohttp

from tuner.replay.record import RequestRecord


def _text_of(choice: dict) -> str:
    text = choice.get("text")
    if text is None:
        delta = choice.get("delta") or {}
        text = delta.get("content") or delta.get("reasoning_content") or ""
    return text


class _Stream:
    """The SSE parse of one response, fed the network reads as they arrive (either transport)."""

    def __init__(self, rec: RequestRecord):
        self.rec = rec
        self.times: list[float] = []
        rec.token_times = self.times
        self.chunks = 0
        self.usage: dict | None = None
        self.done = False
        self.finish_reason = None
        self.buf = b""

    def feed(self, data: bytes, now: float) -> bool:
        """Parse one read that arrived at `now`; False when the stream carried an error (recorded)."""
        rec = self.rec
        buf = self.buf + data
        if b"\r" in buf:  # SSE allows CRLF line ends; a CR split from its LF waits a read
            buf = buf.replace(b"\r\n", b"\n")
        if b"\n\n" not in buf:
            self.buf = buf
            return True
        *events, self.buf = buf.split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.done = True
                    rec.finish_s = now
                    continue
                obj = json.loads(payload)
                if obj.get("error") or obj.get("object") == "error":
                    err = obj.get("error") or obj
                    msg = err.get("message", err) if isinstance(err, dict) else err
                    rec.error = f"server error in stream: {msg}"
                    return False
                if obj.get("usage"):
                    self.usage = obj["usage"]
                for choice in obj.get("choices") or ():
                    if _text_of(choice):
                        if rec.first_token_s is None:
                            rec.first_token_s = now
                        self.times.append(now)
                        self.chunks += 1
                    self.finish_reason = choice.get("finish_reason") or self.finish_reason
        return True

    def check_done(self) -> None:
        """After the stream ended without an error: it must have carried `[DONE]`."""
        if not self.done:
            self.rec.error = ("stream ended before [DONE]" if self.finish_reason is None
                              else f"stream ended before [DONE] (finish_reason={self.finish_reason})")

    def counts(self) -> None:
        """Token counts from the usage block (else the token events); however the request ended."""
        rec = self.rec
        if self.usage is not None:
            rec.output_tokens = int(self.usage.get("completion_tokens") or self.chunks)
            if self.usage.get("prompt_tokens") is not None:
                rec.prompt_tokens = int(self.usage["prompt_tokens"])
        else:
            rec.output_tokens = self.chunks

    def finish(self, clock: Callable[[float], float]) -> None:
        rec = self.rec
        if rec.error is None and rec.first_token_s is None:
            rec.error = "no tokens in a complete stream"
        rec.end_s = clock(time.monotonic()) if rec.finish_s is None else rec.finish_s


async def stream_request_aiohttp(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str],
                                 rec: RequestRecord, clock: Callable[[float], float], *, request_timeout_s: float,
                                 stall_timeout_s: float) -> None:
    """POST `body` to `url` now and fill `rec` in place. `clock` maps `time.monotonic()` to the run's (scaled)
    seconds; timeouts are real seconds (the caller scales them). Never raises except on cancellation, which
    leaves `rec` as measured so far for the caller to mark.

    aiohttp, not httpx: on a 2-core host shared with a CPU-bound vLLM, httpx's 3.7-4.3 ms of client CPU per
    streamed request (aiohttp: 1.9-2.3 ms) slowed the server it measured, to 87-95 req/s served at 100
    offered against 99 under vLLM's own client (benchmarks/RESULTS.md; docs/measurement.md).
    """

    st = _Stream(rec)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=stall_timeout_s, sock_read=stall_timeout_s)
    rec.sent_s = clock(time.monotonic())
    try:
        async with asyncio.timeout(request_timeout_s):
            try:
                async with session.post(url, data=body, headers=headers, timeout=timeout) as resp:
                    if resp.status >= 400:
                        detail = (await resp.content.read(300)).decode("utf-8", "replace")
                        rec.error = f"HTTP {resp.status}: {detail}"
                        return
                    async for data in resp.content.iter_any():
                        if not st.feed(data, clock(time.monotonic())):
                            return
                st.check_done()
            except aiohttp.ServerTimeoutError:
                rec.error = f"stalled: no data for {stall_timeout_s:g}s"
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError) as e:
                if isinstance(e, aiohttp.ClientConnectorError):
                    rec.error = f"ConnectError: {e}"
                else:
                    rec.error = f"connection dropped: {e or type(e).__name__}"
            except aiohttp.ClientError as e:
                rec.error = f"{type(e).__name__}: {e}"
    except TimeoutError:
        rec.error = f"timeout: no complete response in {request_timeout_s:g}s"
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        rec.error = f"bad stream data: {e}"
    finally:
        st.counts()
    st.finish(clock)
