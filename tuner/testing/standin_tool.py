"""A stand-in for the tuner process, for kill tests: launch one server, report it, then wait to be killed.

The kill tests need a *separate* tool process to SIGKILL or SIGINT (killing the test runner itself is not
an option). This one launches a server exactly as the tuner does (`tuner.engine.launcher`), prints one JSON
line with its pid, process group and port, and sleeps inside `try/finally: stop()` like a trial would.

    python -m tuner.testing.standin_tool RUN_DIR [--vllm PYTHON MODEL] [STAND-IN SERVER OPTIONS]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time

from tuner.engine import launcher
from tuner.engine.vllm import VllmEngine
from tuner.knobs import Knobs


def main(argv: list[str] | None = None) -> int:
    # started from a background job, SIGINT arrives ignored; the kill tests send it on purpose
    signal.signal(signal.SIGINT, signal.default_int_handler)
    p = argparse.ArgumentParser(prog="standin_tool")
    p.add_argument("run_dir")
    p.add_argument("--vllm", nargs=2, metavar=("PYTHON", "MODEL"), help="launch real vLLM instead")
    p.add_argument("--vllm-arg", action="append", default=[], help="extra vLLM argument (repeatable)")
    args, server_args = p.parse_known_args(argv)
    extra = [a for a in server_args if a != "--"]

    if args.vllm:
        engine = VllmEngine(args.vllm[1], run_root=args.run_dir, python=args.vllm[0],
                            extra_args=args.vllm_arg, env={"HF_HUB_OFFLINE": "1"})
        server = engine.launch(Knobs(), run_dir=args.run_dir)
        proc = server.process
    else:
        port = launcher.free_port()
        argv_ = [sys.executable, "-m", "tuner.testing.standin_server", "--port", str(port), *extra]
        proc, _info = launcher.launch(argv_, run_dir=args.run_dir, port=port, startup_timeout_s=60)
    try:
        print(json.dumps({"pid": proc.pid, "pgid": proc.pgid, "port": proc.port, "members": proc.members()}),
              flush=True)
        while True:
            time.sleep(0.5)
    finally:
        proc.stop(term_timeout_s=10)
        print(json.dumps({"stopped": True}), flush=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
