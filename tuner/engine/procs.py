"""Process-group and GPU bookkeeping read straight from /proc and `nvidia-smi`.

Kept apart from the launcher because `reap_stale` must work on groups this process did not start (it has
no `Popen` for them) and because psutil is not a dependency: /proc gives everything needed on Linux.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from typing import Iterable

_PROC = "/proc"


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgid, start_ticks) of a pid, or None when it is gone."""
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    rest = data[data.rfind(")") + 2:].split()
    try:
        return rest[0], int(rest[1]), int(rest[2]), int(rest[19])
    except (IndexError, ValueError):
        return None


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot: with the pid, it names one process uniquely."""
    st = _stat(pid)
    return st[3] if st else None


def is_alive(pid: int) -> bool:
    """True for a running (not zombie) process."""
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids whose process group is `pgid`.

    Zombies are left out on purpose: they hold no memory or port, and in a container whose PID 1 does not
    reap, an orphaned zombie would otherwise make a stopped server look alive forever.
    """
    out: list[int] = []
    try:
        names = os.listdir(_PROC)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        st = _stat(int(name))
        if st and st[2] == pgid and st[0] not in ("Z", "X"):
            out.append(int(name))
    return sorted(out)


def has_env(pid: int, key: str, value: str) -> bool | None:
    """Whether pid's initial environment has key=value; None when it cannot be read."""
    try:
        with open(f"{_PROC}/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return None
    return f"{key}={value}".encode() in env.split(b"\0")


def owned_members(pgid: int, key: str, value: str, known: Iterable[tuple[int, int]] = ()) -> list[int]:
    """Live members of group `pgid` if that group is provably one launch's, else [].

    Proof needs just one member: one that carries key=value in its environment (every child inherits it),
    or one whose (pid, start ticks) was recorded while the launch ran. One is enough because Linux never
    reuses a process-group id while any process is in the group, so a group with one of ours is all ours.
    Both tests are needed: vLLM's engine core and workers call setproctitle, which overwrites the memory
    /proc/PID/environ reads, so they show no token; the recorded pairs cover them.
    """
    members = group_members(pgid)
    known = set(map(tuple, known))
    for pid in members:
        if has_env(pid, key, value) or (pid, start_ticks(pid)) in known:
            return members
    return []


def snapshot(pids: Iterable[int]) -> list[tuple[int, int]]:
    """(pid, start ticks) pairs of live pids, to recognise exactly these processes later."""
    out = []
    for pid in pids:
        ticks = start_ticks(pid)
        if ticks is not None:
            out.append((pid, ticks))
    return out


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a whole group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


def stop_group(pgid: int, timeout_s: float) -> bool:
    """SIGTERM the group, wait up to `timeout_s`, SIGKILL it; True when no live member is left.

    Only for groups proved ours (`owned_members`): a group id is signalled, not a list of pids, so children
    forked while stopping are caught too.
    """
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while group_members(pgid):
        if time.monotonic() > deadline:
            signal_group(pgid, signal.SIGKILL)
            kill_deadline = time.monotonic() + 10
            while group_members(pgid) and time.monotonic() < kill_deadline:
                time.sleep(0.1)
            break
        time.sleep(0.1)
    return not group_members(pgid)


def gpu_pids() -> dict[int, int] | None:
    """{pid: used MiB} of GPU compute processes, or None where there is no usable `nvidia-smi`."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return parse_compute_apps(out.stdout)


def parse_compute_apps(text: str) -> dict[int, int]:
    """Parse `nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader[,nounits]` output."""
    result: dict[int, int] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        mem = parts[1].split()[0] if parts[1] else ""
        result[int(parts[0])] = int(mem) if mem.isdigit() else 0
    return result


def wait_gpu_released(pids: set[int], timeout_s: float, interval_s: float = 0.5) -> bool:
    """Wait until no pid of `pids` holds GPU memory. True at once where there is no `nvidia-smi`.

    The driver frees a dead process's memory asynchronously; a trial launched before that sees less free
    memory and fails with "Free memory on device ... less than desired", blaming the wrong knob.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        apps = gpu_pids()
        if apps is None or not (pids & apps.keys()):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
