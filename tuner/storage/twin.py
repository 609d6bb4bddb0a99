"""What `--strategy twin` keeps in the study storage (the Optuna study user attribute `twin`).

Schemas only, so the report reads them without the simulator: every fit (its parameters and residuals),
the latest ranking of the whole space, and, for every configuration the twin sent to the engine, what it
predicted before the launch (a verified trial's prediction error is that stored prediction against the
measured capacity, never a prediction made afterwards). `tuner.twin` writes them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from tuner.knobs import Knobs, key_of

ATTR = "twin"
RANKING_KEPT = 40   # predictions of the latest ranking kept in storage (the report shows ten)


class TwinParams(BaseModel):
    """One point of the fit's box (`tuner.twin.params.FREE_PARAMS`); None: the simulator's nominal value."""

    bw_eff: float | None = None
    gemm_eff: float | None = None
    attn_eff: float | None = None
    step_overhead_s: float | None = None
    per_seq_overhead_s: float | None = None
    client_overhead_s: float | None = None   # seconds outside the engine per request (TTFT and E2E)
    #: measured / simulated KV-cache tokens of the launches fitted (the host's memory as vLLM saw it:
    #: other processes, a CPU backend's --kv-cache-memory-bytes); applied to every predicted launch
    kv_scale: float = 1.0
    #: the twin's SLO badness at the capacities the launches measured (geometric mean): its predictions
    #: judge the SLO's thresholds times this, so the twin's knee of a launched configuration falls where
    #: the launch measured it and the rest of the space is predicted relative to it
    slo_scale: float = 1.0
    #: measured / predicted capacity of the launched configurations (geometric mean), applied to every
    #: prediction: the twin's knee search lands below the edge the SLO scale puts at a measured capacity
    #: (3-8% on the hidden-truth engines), so its numbers are put on the launches' scale; the ranking is
    #: unchanged
    capacity_scale: float = 1.0


class FitResult(BaseModel):
    after_trial: int
    trials: list[int]                       # the launches fitted
    params: TwinParams
    loss: float
    nominal_loss: float                     # the same loss at the simulator's nominal parameters
    start: str = "nominal"                  # where the search began: nominal | launch | previous fit
    #: per metric, the median |simulated / measured - 1| over the runs replayed (0.1 = 10%)
    residuals: dict[str, float] = Field(default_factory=dict)
    replays: int = 0                        # simulated load runs the fit took
    wall_s: float = 0.0


class Prediction(BaseModel):
    """What the twin expects a launch of `knobs` to measure."""

    knobs: dict                                   # set knobs only
    capacity_rps: float | None = None             # None: launches, meets the SLO at no rate
    launch_failure: str | None = None             # the twin expects vLLM to refuse it (kind: message)
    binding: str | None = None                    # diagnosis kind at the twin's knee
    curve: list[tuple[float, float | None]] = Field(default_factory=list)  # (rate, badness)
    params_after_trial: int = -1                  # the fit it came from
    screened: bool = False                        # from the quick first pass over the space only
    #: a screen that lost its race there: below this rate, no knee searched (`tuner.twin.predict._bar`)
    below_rps: float | None = None
    #: set when the strategy launched it: the incumbent's measured capacity times the twin's predicted
    #: ratio to the incumbent (the number the strategy acted on; a twin biased alike everywhere cancels)
    anchored_rps: float | None = None

    @property
    def key(self) -> str:
        return key_of(self.knobs)

    @property
    def config(self) -> Knobs:
        """The predicted configuration, as the `Knobs` value the twin ranked."""
        return Knobs.stored(self.knobs)


class Ranking(BaseModel):
    """The whole space as the twin sees it, best first."""

    after_trial: int
    predictions: list[Prediction]
    method: str = "grid"     # grid | tpe
    wall_s: float = 0.0

    def get(self, knobs: dict) -> Prediction | None:
        key = key_of(knobs)
        return next((p for p in self.predictions if p.key == key), None)


class TwinLog(BaseModel):
    gpu: str | None = None
    model: str | None = None
    fits: list[FitResult] = Field(default_factory=list)
    first_ranking: Ranking | None = None   # after the baseline alone
    ranking: Ranking | None = None         # after the latest fit
    #: knobs key -> the twin's prediction for it just before it was launched
    predicted_before_launch: dict[str, Prediction] = Field(default_factory=dict)
    configurations: int = 0                # in the space the twin ranked
    raced_out: int = 0                     # of them, screens that lost their race (`Prediction.below_rps`)
    stop_reason: str | None = None

    @classmethod
    def read(cls, user_attrs: dict[str, Any]) -> "TwinLog | None":
        raw = user_attrs.get(ATTR)
        return cls(**raw) if raw else None

    def dump(self) -> dict:
        out = self.model_copy()
        for name in ("ranking", "first_ranking"):
            r = getattr(out, name)
            if r is not None:
                setattr(out, name, r.model_copy(update={"predictions": r.predictions[:RANKING_KEPT]}))
        return out.model_dump(mode="json")
