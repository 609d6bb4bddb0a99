"""A small OpenAI-compatible streaming server with known timings, for testing the replay client.

Raw asyncio HTTP/1.1 (keep-alive, chunked SSE) rather than starlette/uvicorn: the precision benchmark
drives it at hundreds of streaming requests per second on a 2-core machine, where a framework's
per-request overhead would make the server, not the client, the thing being measured.

Timing is exact by construction: token i of a request is written at `arrival + ttft_s + i * tpot_s`
(absolute deadlines, so delays do not accumulate). A prompt (or chat message) containing a marker
misbehaves on purpose:

- `[fail:500]`  answers HTTP 500 with an OpenAI-style error body;
- `[fail:drop]` streams `fail_after` tokens, then closes the connection mid-body;
- `[fail:stall]` streams `fail_after` tokens, then goes silent for `stall_s`;
- `[fail:error]` streams `fail_after` tokens, then an SSE `{"error": ...}` event and `[DONE]` (what vLLM
  does when generation fails mid-stream);
- `[ttft:X]` / `[tpot:X]` override the delays for that request.

`GET /debug/requests` returns what the server saw (arrival on the shared CLOCK_MONOTONIC, path, the
length-forcing fields), so tests can check send times from the server's side. `/metrics` exports
vLLM-named counters, gauges and a TTFT histogram that move with the traffic.

Run: `python -m tests.helpers.openai_server --port 0 --ttft 0.05 --tpot 0.01`; it prints
`LISTENING <port>` when ready. `start_server()` does that from a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_MARK = re.compile(r"\[(fail|ttft|tpot):([^\]]+)\]")
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)


@dataclass
class Config:
    ttft_s: float = 0.05
    tpot_s: float = 0.01
    tokens_per_chunk: int = 1
    fail_after: int = 2
    stall_s: float = 3600.0
    api_key: str | None = None
    model: str = "test-model"
    time_scale: float | None = None  # exported as data[0].sim_time_scale when set
    crlf: bool = False  # end SSE lines with CRLF, and split each event over two writes


@dataclass
class State:
    running: int = 0
    requests: list[dict] = field(default_factory=list)
    success: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    ttft_buckets: list[int] = field(default_factory=lambda: [0] * (len(_TTFT_BUCKETS) + 1))
    ttft_sum: float = 0.0


class Server:
    def __init__(self, config: Config):
        self.cfg = config
        self.state = State()

    # --- HTTP plumbing -------------------------------------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in
                           (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                keep = await self.route(method, path, headers, body, writer)
                if not keep or headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            try:
                writer.close()
            except Exception:
                pass

    def respond(self, writer, status: int, payload, ctype="application/json") -> None:
        data = payload if isinstance(payload, bytes) else (
            payload.encode() if isinstance(payload, str) else json.dumps(payload).encode())
        reason = {200: "OK", 401: "Unauthorized", 404: "Not Found", 500: "Internal Server Error"}[status]
        writer.write(f"HTTP/1.1 {status} {reason}\r\ncontent-type: {ctype}\r\n"
                     f"content-length: {len(data)}\r\n\r\n".encode() + data)

    async def route(self, method, path, headers, body, writer) -> bool:
        path = path.split("?", 1)[0]
        if path == "/health":
            self.respond(writer, 200, b"", "text/plain")
        elif path == "/metrics":
            self.respond(writer, 200, self.metrics_text(), "text/plain; version=0.0.4")
        elif path == "/debug/requests":
            self.respond(writer, 200, self.state.requests)
        elif self.cfg.api_key and headers.get("authorization") != f"Bearer {self.cfg.api_key}":
            self.respond(writer, 401, {"error": {"message": "Unauthorized", "code": 401}})
        elif path == "/v1/models":
            card = {"id": self.cfg.model, "object": "model", "owned_by": "test", "max_model_len": 32768}
            if self.cfg.time_scale:
                card["sim_time_scale"] = self.cfg.time_scale
            self.respond(writer, 200, {"object": "list", "data": [card]})
        elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            return await self.generate(path, json.loads(body or b"{}"), writer)
        else:
            self.respond(writer, 404, {"error": {"message": f"no route {path}"}})
        await writer.drain()
        return True

    # --- generation ----------------------------------------------------------------------------------
    async def generate(self, path: str, req: dict, writer) -> bool:
        arrival = time.monotonic()
        chat = path.endswith("chat/completions")
        text = (" ".join(m.get("content", "") for m in req.get("messages", [])) if chat
                else str(req.get("prompt", "")))
        marks = dict(_MARK.findall(text))
        n_out = int(req.get("max_tokens") or 16)
        ttft = float(marks.get("ttft", self.cfg.ttft_s))
        tpot = float(marks.get("tpot", self.cfg.tpot_s))
        n_prompt = len(text.split())
        self.state.requests.append({
            "t": arrival, "path": path, "max_tokens": req.get("max_tokens"),
            "min_tokens": req.get("min_tokens"), "ignore_eos": req.get("ignore_eos"),
            "stream": req.get("stream"), "stream_options": req.get("stream_options"),
            "model": req.get("model"), "prompt_head": text[:40]})
        fail = marks.get("fail")
        if fail == "500":
            self.respond(writer, 500, {"object": "error", "message": "injected failure", "code": 500})
            await writer.drain()
            return True
        if not req.get("stream"):
            await asyncio.sleep(max(0.0, arrival + ttft + (n_out - 1) * tpot - time.monotonic()))
            self.respond(writer, 200, self._final(chat, n_out, n_prompt))
            await writer.drain()
            return True

        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        self.state.running += 1
        rid = f"cmpl-{len(self.state.requests)}"
        try:
            if chat:
                self._event(writer, {"id": rid, "object": "chat.completion.chunk", "model": self.cfg.model,
                                     "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                  "finish_reason": None}]})
            sent = 0
            k = max(1, self.cfg.tokens_per_chunk)
            while sent < n_out:
                if fail in ("drop", "stall", "error") and sent >= self.cfg.fail_after:
                    if fail == "error":
                        self._event(writer, {"error": {"object": "error", "message": "injected mid-stream",
                                                       "code": 500}})
                        self._done(writer)
                        await writer.drain()
                        return True
                    if fail == "drop":
                        writer.transport.abort()
                        return False
                    await asyncio.sleep(self.cfg.stall_s)
                    return False
                m = min(k, n_out - sent)
                due = arrival + ttft + (sent + m - 1) * tpot
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                if sent == 0:
                    self._observe_ttft(time.monotonic() - arrival)
                sent += m
                piece = " tok" * m
                finish = "length" if sent >= n_out else None
                choice = ({"index": 0, "delta": {"content": piece}, "finish_reason": finish} if chat else
                          {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish})
                self._event(writer, {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                                     "model": self.cfg.model, "choices": [choice]})
                await writer.drain()
            if (req.get("stream_options") or {}).get("include_usage"):
                self._event(writer, {"id": rid, "object": "text_completion", "model": self.cfg.model,
                                     "choices": [], "usage": {"prompt_tokens": n_prompt,
                                                              "completion_tokens": n_out,
                                                              "total_tokens": n_prompt + n_out}})
            self._done(writer)
            await writer.drain()
            self.state.success += 1
            self.state.prompt_tokens += n_prompt
            self.state.generation_tokens += n_out
            return True
        finally:
            self.state.running -= 1

    def _done(self, writer) -> None:
        data = b"data: [DONE]\r\n\r\n" if self.cfg.crlf else b"data: [DONE]\n\n"
        writer.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(data), data))

    def _event(self, writer, obj: dict) -> None:
        if self.cfg.crlf:
            data = b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\r\n\r\n"
            half = len(data) // 2
            for part in (data[:half], data[half:]):
                writer.write(b"%x\r\n%b\r\n" % (len(part), part))
            return
        data = b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
        writer.write(b"%x\r\n%b\r\n" % (len(data), data))

    def _final(self, chat: bool, n_out: int, n_prompt: int) -> dict:
        text = " tok" * n_out
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                  if chat else {"index": 0, "text": text, "finish_reason": "length"})
        return {"id": "cmpl-x", "object": "chat.completion" if chat else "text_completion",
                "model": self.cfg.model, "choices": [choice],
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                          "total_tokens": n_prompt + n_out}}

    def _observe_ttft(self, v: float) -> None:
        i = next((i for i, le in enumerate(_TTFT_BUCKETS) if v <= le), len(_TTFT_BUCKETS))
        self.state.ttft_buckets[i] += 1
        self.state.ttft_sum += v

    def metrics_text(self) -> str:
        s, lab = self.state, f'engine="0",model_name="{self.cfg.model}"'
        out = [
            "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{lab}}} {s.running}",
            "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{lab}}} 0",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{lab}}} {min(1.0, s.running / 100)}",
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="16",enable_prefix_caching="True",{lab}}} 1.0',
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{{lab},finished_reason="length"}} {s.success}',
            "# TYPE vllm:prompt_tokens_total counter", f"vllm:prompt_tokens_total{{{lab}}} {s.prompt_tokens}",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{lab}}} {s.generation_tokens}",
            "# TYPE vllm:num_preemptions_total counter", f"vllm:num_preemptions_total{{{lab}}} 0",
            "# TYPE vllm:time_to_first_token_seconds histogram",
        ]
        cum = 0
        for le, c in zip((*_TTFT_BUCKETS, "+Inf"), s.ttft_buckets):
            cum += c
            out.append(f'vllm:time_to_first_token_seconds_bucket{{{lab},le="{le}"}} {cum}')
        out += [f"vllm:time_to_first_token_seconds_count{{{lab}}} {cum}",
                f"vllm:time_to_first_token_seconds_sum{{{lab}}} {s.ttft_sum}"]
        return "\n".join(out) + "\n"


async def serve(config: Config, host: str = "127.0.0.1", port: int = 0, ready=None) -> None:
    server = Server(config)
    srv = await asyncio.start_server(server.handle, host, port, backlog=4096)
    if ready is not None:
        ready(srv.sockets[0].getsockname()[1])
    async with srv:
        await srv.serve_forever()


class RunningServer:
    def __init__(self, proc: subprocess.Popen, port: int):
        self.proc, self.port = proc, port
        self.base_url = f"http://127.0.0.1:{port}"

    def requests(self) -> list[dict]:
        import httpx
        return httpx.get(self.base_url + "/debug/requests", timeout=10).json()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextmanager
def start_server(**kw):
    """Run the server in a subprocess (its own interpreter and core, as a real server would be)."""
    args = [sys.executable, "-m", "tests.helpers.openai_server", "--port", "0"]
    for k, v in kw.items():
        if v is True:
            args.append(f"--{k.replace('_', '-')}")
        elif v is not None and v is not False:
            args += [f"--{k.replace('_', '-')}", str(v)]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("LISTENING"):
        proc.kill()
        raise RuntimeError(f"test server did not start: {line!r}")
    srv = RunningServer(proc, int(line.split()[1]))
    try:
        yield srv
    finally:
        srv.stop()


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft-s", "--ttft", type=float, default=0.05)
    p.add_argument("--tpot-s", "--tpot", type=float, default=0.01)
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--fail-after", type=int, default=2)
    p.add_argument("--stall-s", type=float, default=3600.0)
    p.add_argument("--api-key", default=None)
    p.add_argument("--model", default="test-model")
    p.add_argument("--time-scale", type=float, default=None)
    p.add_argument("--crlf", action="store_true")
    a = p.parse_args(argv)
    cfg = Config(ttft_s=a.ttft_s, tpot_s=a.tpot_s, tokens_per_chunk=a.tokens_per_chunk,
                 fail_after=a.fail_after, stall_s=a.stall_s, api_key=a.api_key, model=a.model,
                 time_scale=a.time_scale, crlf=a.crlf)

    def ready(port: int) -> None:
        print(f"LISTENING {port}", flush=True)

    try:
        asyncio.run(serve(cfg, port=a.port, ready=ready))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
