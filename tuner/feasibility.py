"""What the workload and the model tell before any launch: requests longer than the served context, and
SLO thresholds below the single-stream floor of the request that decides them.

A study that learns these from its load runs spends a launch, several load runs and (with the twin) a
ranking of the whole space on what no configuration can change. Both are known from the workload file
and the model's profile, so they are said here, once, with the count, before the study is created:

- requests whose prompt + output exceed the served context (vLLM answers them with HTTP 400: they are
  never good). When they alone leave the SLO's target out of reach the study is refused (exit 2) with
  the count and the option that scores the rest, `--drop-overlong`; when they use part of the target's
  room it is said, and the study goes on.
- a threshold below the single-stream floor of the request at the target's rank (`tuner.floors`,
  priced by the simulator's cost model: a prediction, and labelled so).

Argument and file validation (`tuner.inputs`, `tuner.preflight`) is another concern: this module judges
valid inputs against each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner.errors import UserError
from tuner.floors import Lengths, gate_floors
from tuner.knobs import Knobs
from tuner.profiles.gpus import get_gpu
from tuner.profiles.models import get_model
from tuner.sim.config import resolve
from tuner.slo import SLO
from tuner.workload.model import Workload
from tuner.workload.stats import prompt_length

DROP_OPTION = "--drop-overlong"


@dataclass
class Feasibility:
    """Lines to say before the first launch, and the workload to score (overlong requests dropped when
    the user asked)."""

    workload: Workload
    notes: list[str] = field(default_factory=list)


def served_context(model: str | None, space_knobs: dict | None = None, vllm_args: list[str] | None = None
                   ) -> tuple[int, str] | None:
    """(tokens, where that limit comes from) the study serves, or None where the model is unknown: a
    `--max-model-len` server argument, else the largest `max_model_len` of the space, else the model's."""
    for a in vllm_args or ():
        if a.startswith("--max-model-len="):
            try:
                return int(a.split("=", 1)[1]), "--vllm-arg=--max-model-len"
            except ValueError:
                return None
    spec = (space_knobs or {}).get("max_model_len")
    if spec is not None:
        vals = [v for v in spec.values if v is not None]
        if vals and None not in spec.values:
            return max(vals), "the search space's largest max_model_len"
    if not model:
        return None
    try:
        prof = get_model(model)
    except Exception:  # noqa: BLE001  (a model the profiles do not know: real vLLM reads it itself)
        return None
    return prof.default_len, f"{prof.name or model}'s default max_model_len"


def overlong(workload: Workload, context: int) -> list[int]:
    """Indices of the requests whose prompt + output exceed `context` (vLLM's own check)."""
    return [i for i, r in enumerate(workload.requests) if prompt_length(r) + r.output_tokens > context]


def check_workload(workload: Workload, slo: SLO, *, model: str | None, gpu: str | None,
                   space_knobs: dict | None = None, vllm_args: list[str] | None = None,
                   drop_overlong: bool = False, where: str = "--workload") -> Feasibility:
    """The pre-launch check (see the module docstring). Raises `UserError` when the overlong requests
    alone break the SLO's target and the user did not ask to drop them."""
    out = Feasibility(workload)
    ctx = served_context(model, space_knobs, vllm_args)
    if ctx is not None:
        out.workload = _context(out, workload, slo, ctx, drop_overlong, where)
    if gpu and model:
        out.notes += floor_notes(out.workload, slo, gpu, model)
    return out


def _context(out: Feasibility, workload: Workload, slo: SLO, ctx: tuple[int, str], drop: bool,
             where: str) -> Workload:
    """Count the overlong requests; drop them, say so, or refuse the study when they alone break it."""
    tokens, src = ctx
    bad = overlong(workload, tokens)
    if not bad:
        return workload
    n, target = len(workload.requests), float(slo.target)  # type: ignore[arg-type]

    longest = max(prompt_length(workload.requests[i]) + workload.requests[i].output_tokens for i in bad)
    what = (f"{len(bad)} of {n} requests ({len(bad) / n:.1%}; the longest {longest:,} tokens, prompt + "
            f"output) exceed the {tokens:,}-token context ({src}): vLLM refuses them")
    if drop:
        keep = set(range(n)) - set(bad)
        out.notes.append(f"pre-flight: {what}; {DROP_OPTION}: scoring the other {len(keep)}")
        return workload.model_copy(update={"requests": [r for i, r in enumerate(workload.requests)
                                                        if i in keep]})
    if n - len(bad) < target * n:
        raise UserError(f"{what}, so no configuration can reach the SLO's target {target:g} (at most "
                        f"{(n - len(bad)) / n:.3g}): pass {DROP_OPTION} to score the other {n - len(bad)}, "
                        "or a longer context", file=where)
    room = (1 - target) * n
    out.notes.append(f"pre-flight: {what}; they use {len(bad) / room:.0%} of the {1 - target:.1%} of requests "
                     f"the target {target:g} lets miss ({DROP_OPTION} scores the rest)")
    return workload


def floor_notes(workload: Workload, slo: SLO, gpu: str, model: str) -> list[str]:
    """Thresholds below the predicted single-stream floor of the request at the target's rank, with
    vLLM's default configuration on this GPU (no knob lowers a single request's floor much)."""
    try:
        cfg = resolve(get_gpu(gpu), get_model(model), Knobs())
        gates = gate_floors(cfg, slo, Lengths.of_workload(workload))
    except Exception:  # noqa: BLE001  (a model that does not fit, an unknown profile: the launch says it)
        return []
    return [f"pre-flight (predicted by the cost model): {g.message}" for g in gates if not g.ok]


__all__ = ["Feasibility", "check_workload", "served_context", "overlong", "floor_notes", "DROP_OPTION"]
