"""The twin's free parameters: the cost model's efficiencies and overheads, and the client's own latency.

Each is written down once here (name, bounds, log scale); the fit searches the box, the twin applies a
point of it (`tuner.storage.twin.TwinParams`, None = nominal). What is not here is held at the
simulator's nominal value: the twin's structure is the simulator's, and the fit can only move these
numbers (the hidden-truth benchmark relies on that).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from tuner.sim.costs import CostParams
from tuner.storage.twin import TwinParams


@dataclass(frozen=True)
class FreeParam:
    name: str
    low: float
    high: float
    why: str

    def clip(self, v: float) -> float:
        return min(max(v, self.low), self.high)


#: The simulator has no client: a request's HTTP, tokenisation and detokenisation time, nominally.
NOMINAL_CLIENT_OVERHEAD_S = 0.002

#: The box the fit searches (log scale). Wide enough for a GPU the profiles describe loosely and for a
#: CPU host, whose "efficiencies" against a nominal device profile are far from a GPU's.
FREE_PARAMS: tuple[FreeParam, ...] = (
    FreeParam("bw_eff", 0.05, 1.0, "achieved / peak bandwidth: weight and KV streaming (decode)"),
    FreeParam("gemm_eff", 0.02, 1.0, "achieved / peak GEMM throughput (prefill, large batches)"),
    FreeParam("attn_eff", 0.02, 1.0, "achieved / peak attention FLOPs (long prompts)"),
    FreeParam("step_overhead_s", 1e-4, 5e-2, "fixed seconds per engine step (scheduler, sampling)"),
    FreeParam("per_seq_overhead_s", 1e-7, 1e-3, "seconds per sequence in a step (input preparation)"),
    FreeParam("client_overhead_s", 1e-4, 0.5, "per-request latency outside the engine (HTTP, "
                                              "tokenisation, detokenisation): added to TTFT and E2E"),
)
_COST_FIELDS = {f.name for f in fields(CostParams)}


def value(params: TwinParams, name: str) -> float:
    """A free parameter's value, nominal where `params` leaves it unset."""
    v = getattr(params, name)
    if v is not None:
        return v
    return NOMINAL_CLIENT_OVERHEAD_S if name == "client_overhead_s" else getattr(CostParams(), name)


def nominal(kv_scale: float = 1.0) -> TwinParams:
    return TwinParams(**{p.name: value(TwinParams(), p.name) for p in FREE_PARAMS}, kv_scale=kv_scale)


def from_values(values: dict[str, float], kv_scale: float = 1.0) -> TwinParams:
    return TwinParams(**{p.name: p.clip(float(values[p.name])) for p in FREE_PARAMS if p.name in values},
                      kv_scale=kv_scale)


def cost_params(params: TwinParams, base: CostParams | None = None) -> CostParams:
    """The simulator's cost parameters under `params` (what it leaves unset stays at `base`)."""
    vals = {p.name: getattr(params, p.name) for p in FREE_PARAMS
            if p.name in _COST_FIELDS and getattr(params, p.name) is not None}
    return replace(base or CostParams(), **vals)
