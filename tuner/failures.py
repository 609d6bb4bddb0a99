"""Launch failures, classified the way vLLM fails.

Shared by the simulator (which fails where vLLM would) and the launchers (which read vLLM's log), so both
speak one vocabulary of kinds and the search learns the same lesson from either. What the search learns
from a failure's numbers it reads from `LaunchFacts`, typed fields the engine package's log classifier
(`tuner.engine.classify.launch_facts`) fills: vLLM's words are matched there, never above the engines.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

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


class LaunchFacts(BaseModel):
    """The numbers and names a failed launch's message states, as fields (None: the message did not say).

    Stored on the trial's record (`TrialRecord.launch_facts`), so the lessons (`tuner.search.lessons`) and
    the strategies read what vLLM said without knowing how it says it."""

    #: `memory_utilization`: the memory free at start-up and in all (GiB), and the utilisation vLLM resolved
    free_gib: float | None = None
    total_gib: float | None = None
    asked_utilization: float | None = None
    #: `max_model_len`: the longest context vLLM estimates the KV pool could hold
    estimated_max_model_len: int | None = None
    #: knobs the message names, most specific first (`unsupported`: the dtype or quantisation it lacks)
    named_knobs: list[str] = Field(default_factory=list)


class LaunchFailure(Exception):
    """A launch that did not become healthy: its `kind`, the one-line `message`, the log's tail, and the
    typed `facts` the engine read from it (an engine that reads none leaves them empty)."""

    def __init__(self, kind: LaunchFailureKind, message: str, log_tail: str = "",
                 facts: LaunchFacts | None = None):
        self.kind = kind
        self.message = message
        self.log_tail = log_tail
        self.facts = facts or LaunchFacts()
        super().__init__(f"{kind}: {message}")
