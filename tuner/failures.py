"""Launch failures, classified the way vLLM fails.

Shared by the simulator (which fails where vLLM would) and the launchers (which read vLLM's log), so both
speak one vocabulary of kinds and the search learns the same lesson from either.
"""

from __future__ import annotations

from typing import Literal

LaunchFailureKind = Literal[
    "oom",                 # torch.OutOfMemoryError / weights do not fit
    "no_cache_blocks",     # "No available memory for the cache blocks"
    "max_model_len",       # KV too small for one max_model_len sequence
    "memory_utilization",  # "Free memory on device ... less than desired GPU memory utilization"
    "bad_flag",            # argparse invalid choice / invalid value / unsupported combination
    "unsupported",         # the hardware or build lacks a kernel (e.g. fp8 on CPU)
    "timeout",             # never became healthy in time
    "crash",               # exited for another reason
]


class LaunchFailure(Exception):
    def __init__(self, kind: LaunchFailureKind, message: str, log_tail: str = ""):
        self.kind = kind
        self.message = message
        self.log_tail = log_tail
        super().__init__(f"{kind}: {message}")
