"""What hardware a real engine ran on, in words for the report: the GPUs `nvidia-smi` lists, or a CPU host.

Recorded when a study starts (`StudyInfo.host`), because a report read later, elsewhere, must not guess:
a report of vllm-cpu runs once said "on the local GPU" and its plan counted GPUs on a host that had none.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections import Counter


def gpus() -> list[str]:
    """The GPU names `nvidia-smi` lists (empty when there is none or it cannot be run)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def describe_host() -> str:
    """'2 x NVIDIA H100 80GB HBM3' or 'CPU host (2 cores, x86_64), no GPU visible'."""
    names = gpus()
    if names:
        return ", ".join(f"{n} x {name}" for name, n in Counter(names).items())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"CPU host ({cores} cores, {platform.machine() or 'unknown'}), no GPU visible"


def is_cpu_host(description: str | None) -> bool:
    return bool(description) and description.startswith("CPU host")
