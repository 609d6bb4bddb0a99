"""Each knob's share of an accepted step that changed several knobs, as the study stored it.

The twin jumps several knobs at once; the product promises what each knob was worth. The study asks the
fitted twin for the step's configuration with one knob left out at a time (`tuner.search.attribute`) and
stores the predictions here, labelled as predictions; `--attribute` adds a measured launch of each
leave-one-out configuration. The report reads this attribute, never the twin.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

ATTR = "shares"


class KnobShare(BaseModel):
    """One knob of a multi-knob step: the step's configuration without it, predicted (and measured)."""

    knob: str
    without_knobs: dict                          # the step's configuration with this knob as before it
    predicted_without_rps: float | None = None   # the twin's capacity for it (None: meets the SLO nowhere)
    predicted_share_pct: float | None = None     # (predicted step - predicted without) / predicted before
    within_noise: bool = False                   # predicted share inside the noise floor: dropped
    measured_trial: int | None = None            # `--attribute`: the launch of `without_knobs`
    measured_without_rps: float | None = None
    measured_share_pct: float | None = None      # (measured step - measured without) / measured before


class StepShares(BaseModel):
    trial: int                                   # the accepted trial
    before_trial: int                            # the incumbent it replaced
    fit_after_trial: int = -1                    # the twin fit the predictions came from
    predicted_before_rps: float | None = None
    predicted_after_rps: float | None = None
    knobs: list[KnobShare] = Field(default_factory=list)


class Simplification(BaseModel):
    """The final configuration less the knobs whose predicted share was within noise, and the launch that
    measured it (a recommendation is always a configuration that was measured)."""

    from_trial: int
    dropped: list[str]
    knobs: dict
    predicted_rps: float | None = None
    trial: int | None = None                     # the confirming launch (None: not launched, see `note`)
    note: str = ""


class SharesLog(BaseModel):
    floor: float = 0.05
    steps: list[StepShares] = Field(default_factory=list)
    simplification: Simplification | None = None
    verified: bool = False                       # `--attribute`: every share was measured too

    @classmethod
    def read(cls, user_attrs: dict[str, Any]) -> "SharesLog | None":
        raw = user_attrs.get(ATTR)
        return cls(**raw) if raw else None
