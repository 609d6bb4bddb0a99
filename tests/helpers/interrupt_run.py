"""Run a load in this process until SIGINT arrives, then print what `run_load_http` returned.

A Ctrl-C test needs its own process: the signal must reach the interpreter running the event loop, and
must never reach pytest. Usage: `python -m tests.helpers.interrupt_run BASE_URL N RATE`.
"""

from __future__ import annotations

import json
import signal
import sys

from tuner.replay.client import run_load_http
from tuner.workload.model import WorkloadRequest

# A process started from a background job inherits SIGINT ignored, and Python then installs no
# KeyboardInterrupt handler: the test's Ctrl-C would be lost. This harness is about Ctrl-C, so it asks for it.
signal.signal(signal.SIGINT, signal.default_int_handler)


def main() -> None:
    base_url, n, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    reqs = [WorkloadRequest(prompt_tokens=20, output_tokens=50) for _ in range(n)]

    def progress(sent, done, ok):
        if sent:
            print(f"SENT {sent}", file=sys.stderr, flush=True)

    run = run_load_http(base_url, reqs, [i / rate for i in range(n)], offered_rate=rate, progress=progress)
    print(json.dumps({
        "interrupted": run.interrupted,
        "errors": [r.error for r in run.records],
        "ok": sum(r.ok for r in run.records),
        "warnings": run.warnings,
    }), flush=True)


if __name__ == "__main__":
    main()
