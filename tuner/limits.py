"""Ranges of every number a user gives, written once, and the load-run settings as a checked model.

A number outside its range is a user mistake that costs nothing to catch before the run and a lot after
it: `--requests-per-run 1e12` allocates a schedule of a trillion requests, a NaN rate never compares
true and a loop waits forever, `load.requests: 0` in a gate measures nothing and then passes. The bounds
are far beyond any real use (a month-long run, a million requests a second) and far below what breaks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner.errors import UserError
from tuner.inputs import yaml_line
from tuner.validation import first_error

MAX_REQUESTS = 1_000_000        # requests in one load run
MAX_RATE_RPS = 1_000_000.0      # an offered rate (req/s)
MAX_SECONDS = 31 * 24 * 3600.0  # a run, a timeout, a time budget: a month
MAX_TRIALS = 100_000            # engine launches of one study
#: The seed of a run when none is given: its load runs', its engine's noise and its twin's fit.
SEED = 0
MAX_SEED = 2 ** 32 - 1          # numpy's legacy seeding takes no more
MAX_SYNTH_REQUESTS = 10_000_000  # `tune workload synth --requests`: held in memory while written
MAX_TIME_SCALE = 10_000.0       # sim-http: the simulated GPU this many times slower
#: `--strategy grid` enqueues every configuration of the space as a trial before the first launch; a
#: space larger than this is refused (the twin, tpe and random search any size).
MAX_GRID_CONFIGS = 10_000


class LoadSpec(BaseModel):
    """`LoadSettings` (tuner.capacity.measure) as a user may write it in a gate's `load:` section: the same
    fields, each with the range the study's own options allow, so a gate is as strict as the study."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    requests: int = Field(1000, ge=1, le=MAX_REQUESTS, strict=True)
    max_duration_s: float | None = Field(None, gt=0, le=MAX_SECONDS)
    sequential: bool = Field(True, strict=True)
    steady_tolerance: float = Field(0.05, ge=0, lt=1)
    latency_spans: float = Field(3.0, gt=0, le=1000)
    warmup_frac: float = Field(0.1, ge=0, lt=1)
    cooldown_frac: float = Field(0.05, ge=0, lt=1)
    request_timeout_s: float = Field(120.0, gt=0, le=MAX_SECONDS)
    arrival: Literal["poisson", "gamma", "trace"] = "poisson"
    burstiness: float = Field(1.0, gt=0, le=1000)
    seed: int = Field(SEED, ge=0, le=MAX_SEED, strict=True)
    warmup_requests: int = Field(50, ge=0, le=MAX_REQUESTS, strict=True)
    max_concurrency: int | None = Field(None, ge=1, le=MAX_REQUESTS, strict=True)
    pass_ceiling_rps: float | None = Field(None, gt=0, le=MAX_RATE_RPS)


def check_load(load: Any, where: str | Path | None, root: Any = None) -> dict[str, Any]:
    """`load` checked field by field (a `UserError` naming `load.FIELD` and its line), as a plain dict of
    only the fields given."""
    if not isinstance(load, dict):
        raise UserError("must be a mapping", file=where, line=yaml_line(root, ["load"]), field="load")
    try:
        LoadSpec.model_validate(load)
    except ValidationError as e:
        field, msg = first_error(e)
        line = yaml_line(root, ["load", *(field.split(".") if field else [])]) if root is not None else None
        if msg == "unknown field":
            msg = f"unknown key {field!r} (known: {', '.join(LoadSpec.model_fields)})"
        raise UserError(msg, file=where, line=line, field=f"load.{field}" if field else "load") from None
    return dict(load)
