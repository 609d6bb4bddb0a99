"""A tiny stand-in for an OpenAI-compatible server, for launcher tests that must not need vLLM.

It behaves like a server in the ways the launcher cares about, each switchable from the command line:
slow to become healthy, dying at start-up with a given log message (to test classification), forking a
child into its process group (as vLLM forks its engine core and workers), ignoring SIGTERM (to test the
SIGKILL escalation), failing every completion request (to test a server that serves nothing). Stdlib only, so it starts in a fraction of a second on a busy CI machine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _handler(ready_at: float, model: str, fail_requests: int = 500):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *args):  # one access-log line per request, like uvicorn
            sys.stdout.write(f'INFO:     {self.address_string()} - "{self.requestline}" {args[1]}\n')
            sys.stdout.flush()

        def _send(self, code: int, body: dict | str, ctype: str = "application/json") -> None:
            data = (json.dumps(body) if isinstance(body, dict) else body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 (http.server's naming)
            if self.path == "/health":
                self._send(200 if time.monotonic() >= ready_at else 503, {})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": model, "object": "model"}]})
            elif self.path == "/metrics":
                self._send(200, "vllm:num_requests_running{model_name=\"%s\"} 0.0\n" % model, "text/plain")
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self):  # noqa: N802
            # it serves no completions: every request fails, the way vLLM's error responses look
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._send(fail_requests, {"object": "error", "type": "InternalServerError", "code": fail_requests,
                                       "message": "standin server: this request failed on purpose"})

    return Handler


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="standin_server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="standin")
    p.add_argument("--startup-delay", type=float, default=0.0, help="seconds before /health says 200")
    p.add_argument("--fail", default=None, help="print this line and exit 1 after the delay")
    p.add_argument("--fail-signal", type=int, default=None, help="kill itself with this signal instead")
    p.add_argument("--children", type=int, default=0, help="fork this many sleeping children")
    p.add_argument("--ignore-term", action="store_true", help="ignore SIGTERM (needs SIGKILL)")
    p.add_argument("--print-env", default=None, help="print the value of this environment variable")
    p.add_argument("--fail-requests", type=int, default=500, help="HTTP status of every completion request")
    args = p.parse_args(argv)

    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.print_env:
        print(f"env {args.print_env}={os.environ.get(args.print_env)}", flush=True)
    print(f"INFO standin server pid={os.getpid()} argv={sys.argv[1:]}", flush=True)
    kids = [subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
            for _ in range(args.children)]
    print(f"INFO children {[k.pid for k in kids]}", flush=True)
    if args.fail is not None or args.fail_signal is not None:
        time.sleep(args.startup_delay)
        if args.fail_signal is not None:
            os.kill(os.getpid(), args.fail_signal)
        print(args.fail, file=sys.stderr, flush=True)
        return 1
    server = ThreadingHTTPServer((args.host, args.port), _handler(time.monotonic() + args.startup_delay,
                                                                  args.model, args.fail_requests))
    server.daemon_threads = True
    print(f"INFO Starting server on http://{args.host}:{args.port}", flush=True)
    if not args.ignore_term:
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever(poll_interval=0.1)
    print("INFO Shutting down", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
