"""`tune ARGS`, exactly as the console script runs it, that sends itself a real SIGINT (or SIGTERM) at one
precise point of the study: a Ctrl-C from outside cannot aim at the last milliseconds of a load run.

The point comes from the environment, `TUNER_TEST_SIGNAL=POINT:N[:TERM]`, the N-th time (from 1) the
study reaches POINT:

- `startup`: a server was just spawned and the launcher starts waiting for its `/health` (vLLM: minutes);
- `last-request`: the last request of a load run is in flight, all the others answered;
- `run-end`: a load run has just been built as finished, before the replay returns it (the instant where a
  Ctrl-C used to be swallowed);
- `ask`: a trial was just created in the storage, before anything ran for it;
- `tell`: a trial's record is being written to the storage.

The code of the study runs unchanged: each point is a real function of the tool, called as always, with
`os.kill(own pid, SIGINT)` after it. The harness prints `SIGNAL SENT <monotonic time>` on stderr when it
sends. Usage: `TUNER_TEST_SIGNAL=run-end:3 python -m tests.helpers.interrupt_study --workload ...`.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time


def _arm() -> None:
    spec = os.environ.get("TUNER_TEST_SIGNAL", "")
    if not spec:
        return
    parts = spec.split(":")
    point, nth = parts[0], int(parts[1])
    sig = signal.SIGTERM if parts[2:] == ["TERM"] else signal.SIGINT
    seen = {"n": 0, "sent": False}

    def hit() -> None:
        seen["n"] += 1
        if seen["n"] == nth and not seen["sent"]:
            seen["sent"] = True
            print(f"SIGNAL SENT {time.monotonic():.6f} at {point}:{nth}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), sig)

    from tuner.engine import launcher
    from tuner.replay import client
    from tuner.search import runner

    if point == "startup":
        orig = launcher.ManagedProcess.wait_healthy

        @functools.wraps(orig)
        def wait_healthy(self, *a, **kw):
            hit()
            return orig(self, *a, **kw)
        launcher.ManagedProcess.wait_healthy = wait_healthy
    elif point == "last-request":
        orig_one = client._Runner._one

        @functools.wraps(orig_one)
        async def _one(self, *a, **kw):
            try:
                return await orig_one(self, *a, **kw)
            finally:
                if self.done == len(self.records) - 1:
                    hit()
        client._Runner._one = _one
    elif point == "run-end":
        orig_finish = client._Runner._finish

        @functools.wraps(orig_finish)
        def _finish(self, *a, **kw):
            out = orig_finish(self, *a, **kw)
            if not out.interrupted:
                hit()
            return out
        client._Runner._finish = _finish
    elif point == "ask":
        orig_ask = runner.TrialRunner.ask

        @functools.wraps(orig_ask)
        def ask(self, *a, **kw):
            out = orig_ask(self, *a, **kw)
            hit()
            return out
        runner.TrialRunner.ask = ask
    elif point == "tell":
        import optuna

        orig_set = optuna.Trial.set_user_attr

        @functools.wraps(orig_set)
        def set_user_attr(self, key, value):
            out = orig_set(self, key, value)
            if key == "record":
                hit()
            return out
        optuna.Trial.set_user_attr = set_user_attr
    else:
        raise SystemExit(f"unknown point {point!r}")


def main() -> None:
    _arm()
    from tuner.cli import main as tune_main

    sys.argv = ["tune", *sys.argv[1:]]
    tune_main()


if __name__ == "__main__":
    main()
