"""What the paired check after the search measured (`tuner.search.earn`), as the study stores it.

The study attribute `earned`: which paired trials measured vLLM's defaults, the search's best and each
leave-one-knob-out configuration on the common windows, and which knob each removal step tried. The
figures themselves (window capacities) are in those trials' records; the recommendation
(`tuner.recommend`) recomputes every share and gain from them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

ATTR = "earned"


class RemovalStep(BaseModel):
    """One knob tried for removal: the configuration carrying it against the same without it."""

    knob: str
    with_trials: list[int]       # the paired trials of the configuration carrying the knob
    without_trials: list[int]    # the paired trials without it (a dropped knob's: extended to every window)
    kept: bool                   # the knob earned its place (`tuner.recommend.knob_earns`)
    note: str = ""


class EarnedLog(BaseModel):
    floor: float
    test: str
    window_seeds: list[int] = Field(default_factory=list)
    grid_step: float = 0.025
    #: the paired trials of each configuration (a configuration's windows are those of all its paired trials)
    defaults_trials: list[int] = Field(default_factory=list)  # vLLM's defaults (as the host allowed them)
    best_trials: list[int] = Field(default_factory=list)      # the search's best (none: it ended on the defaults)
    best_source_trial: int | None = None  # the knee-search trial it came from
    steps: list[RemovalStep] = Field(default_factory=list)
    final_trials: list[int] = Field(default_factory=list)     # what survived the removals and clears the floor
    launches: int = 0                     # launches this check spent (beyond --max-trials)
    note: str = ""

    @classmethod
    def read(cls, user_attrs: dict[str, Any]) -> "EarnedLog | None":
        raw = user_attrs.get(ATTR)
        return cls(**raw) if raw else None
