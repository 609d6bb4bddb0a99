"""What the strategies share: the budget, the outcome, the baseline, confirmation and acceptance rules.

The strategies themselves are in `tuner.search.strategies` (one module each, found by name):
`guided` (the product's idea: diagnose the binding constraint, turn the knob that answers it), `twin`
(rank the whole space in a simulator fitted to this engine's launches, launch only to verify), and
`tpe`, `random` and `grid` (the whole space blind, what peer tools do). They share the same trial runner
and storage, and the rules here.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from tuner.knobs import KNOB_SPECS, Knobs, neutral_values
from tuner.storage.records import Diagnosis, TrialRecord
from tuner.search.runner import TrialRunner
from tuner.settings import default


@dataclass
class Budget:
    max_trials: int = field(default_factory=lambda: default("max_trials"))  # declared in `tuner.settings`
    time_budget_s: float | None = None
    started: float = 0.0

    def left(self, runner: TrialRunner) -> bool:
        if runner.launches >= self.max_trials:
            return False
        return not (self.time_budget_s and time.monotonic() - self.started > self.time_budget_s)


@dataclass
class Outcome:
    baseline: TrialRecord | None
    incumbent: TrialRecord | None
    stop_reason: str
    chain: list[int] | None = None  # trials that became the incumbent, in order (the baseline first)
    status: str = "tuned"           # or "no_launch" / "no_pass" (tuner.storage.status), set by run_tune
    status_text: str | None = None  # why there is no result, in one line
    twin: Any = None                # `--strategy twin`: the fitted twin (it predicts the knobs' shares)
    handed_over: bool = False       # `--strategy twin` handed the study to the diagnosis-led search


def values_toward(value: Any, values: list[Any], direction: str) -> list[Any]:
    """Candidate values of one knob in the order worth trying from the incumbent's `value`."""
    others = [v for v in values if v != value and v is not None]
    if direction in ("up", "down") and value is not None and all(isinstance(v, (int, float)) for v in others):
        if direction == "up":
            return sorted(v for v in others if v > value)
        return sorted((v for v in others if v < value), reverse=True)
    if value is not None and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in others):
        # no preferred direction: nearest values first, alternating sides
        return sorted(others, key=lambda v: abs(math.log(v / value)) if value and v > 0 else v)
    if direction == "on":  # a switch on, or any setting of a knob that is off when unset
        return [v for v in others if v is True or not isinstance(v, bool)]
    if direction == "off":
        return [v for v in others if v is False]
    return others


def narrowed(knob: str, values: list[Any], direction: str, diag: Diagnosis | None, stated: dict[str, float],
              current: Any) -> list[Any]:
    """The candidate values of `knob` worth launching, in order, as the knob's own hook sees them at the
    knee the incumbent's diagnosis describes (`KnobSpec.narrow`: the batch caps that cannot bind dropped,
    speculative configs ordered for the batch)."""
    hook = KNOB_SPECS[knob].narrow
    return values if hook is None else hook(values, direction, diag.evidence if diag else {}, stated, current)


def normalize(knobs: Knobs, defaults: dict[str, Any]) -> Knobs:
    """Unset the knobs whose value is vLLM's default: `--kv-cache-dtype auto` is the baseline."""
    same = {**neutral_values(), **defaults}
    return Knobs.stored({k: v for k, v in knobs.set_only().items() if same.get(k, object()) != v})


def current_value(knobs: Knobs, name: str, defaults: dict[str, Any]) -> Any:
    v = getattr(knobs, name)
    if v is None:
        return {**neutral_values(), **defaults}.get(name)
    return v


TIE_MARGIN = 0.0


def clearly_better_at_same_load(rec: TrialRecord, inc: TrialRecord, margin: float = TIE_MARGIN) -> bool:
    """A tie on capacity (the same bracket) broken by the SLO stress at the incumbent's capacity: both
    ran the same requests at the same rate there, so a candidate whose badness is `margin` lower is
    better, even when the incumbent's own capacity estimate came out lucky-high. It must not be worse
    at any common rate above that either (a tighter batch cap can look better at one load and collapse
    just above it). Without this, one noisy-high incumbent hides every real gain below the noise floor."""
    cap = inc.capacity_rps
    if not cap or not rec.capacity_rps or rec.capacity_rps < cap:
        return False

    def at(runs, rate):
        return next((p for p in reversed(runs) if abs(p.rate / rate - 1) < 1e-6 and p.badness is not None),
                    None)

    mine, theirs = at(rec.load_runs, cap), at(inc.load_runs, cap)
    if mine is None or theirs is None or mine.badness >= (1 - margin) * theirs.badness:
        return False
    # above the capacity, the candidate may not be worse than the incumbent was at the same or a higher
    # rate (the two knee searches rarely probe identical rates; badness grows with the rate)
    for q in rec.load_runs:
        if q.rate <= cap * (1 + 1e-6) or q.badness is None or q.rate >= 1e5:
            continue
        for p in inc.load_runs:
            if p.rate >= q.rate * (1 - 1e-6) and p.rate < 1e5 and p.badness is not None \
                    and q.badness > p.badness:
                return False
    return True


def accept_floor(inc: TrialRecord, floor: float) -> float:
    """The capacity a candidate must beat: the incumbent's by the noise floor, and, where the incumbent's
    own measurement is uncertain, up to the rate at which it failed clearly (`capacity_high_rps`): a
    gain inside the incumbent's uncertainty is not a gain. Capped at twice the floor, so that one
    incumbent measured coarsely does not block every candidate (the same-load tie-break still applies)."""
    cap = inc.capacity_rps or 0.0
    need = cap * (1 + floor)
    if inc.capacity_high_rps:
        need = max(need, min(inc.capacity_high_rps, cap * (1 + 2 * floor)))
    return need


NEGLIGIBLE_SPREAD = 0.01  # two launches of one configuration within 1%: the engine is deterministic


class LaunchNoise:
    """The launch-to-launch spread of capacity seen so far, from pairs of launches of one configuration.
    A deterministic engine (the noise-free simulator) shows none on the baseline's pair, and then no
    further launch is spent on confirmation."""

    def __init__(self) -> None:
        self.spreads: list[float] = []

    def add(self, a: float | None, b: float | None) -> None:
        if a and b:
            self.spreads.append(abs(math.log(a / b)))

    @property
    def negligible(self) -> bool:
        return bool(self.spreads) and max(self.spreads) < NEGLIGIBLE_SPREAD

    def floor(self, configured: float) -> float:
        """The gain a candidate must show: the configured floor, or 1% on a deterministic engine, which
        resolves any gain the knee search's bracket does, and never less than the largest spread two
        launches of one configuration showed (a gain smaller than that is the launch, not the knob)."""
        if self.negligible:
            return NEGLIGIBLE_SPREAD
        return max([configured] + [math.expm1(s) for s in self.spreads])


def _launch_again(runner: TrialRunner, rec: TrialRecord, against: float | None,
                  noise: LaunchNoise) -> TrialRecord:
    """A second launch of `rec`'s configuration, measured from its claimed capacity; the lower of the
    two estimates is returned, and their spread is noted."""
    again = runner.evaluate(rec.config, role="confirm", changed_knob=rec.changed_knob,
                            start_rate=rec.capacity_rps, incumbent=against, fresh=True)
    noise.add(rec.capacity_rps, again.capacity_rps)
    return again if (again.capacity_rps or 0.0) < (rec.capacity_rps or 0.0) else rec


def confirm_incumbent(runner: TrialRunner, rec: TrialRecord, budget: Budget, against: TrialRecord,
                      noise: LaunchNoise) -> TrialRecord | None:
    """The winner's curse: of several noisy candidates, the one that beats the incumbent is the one whose
    launch came out lucky, and a lucky-high incumbent then races every real gain out. A second launch of
    the candidate, measured from its claimed capacity; the lower of the two estimates stands, and must
    still be no worse than the incumbent's (itself the lower of two launches), or the candidate is
    dropped. Returns the record that stands for the candidate, or None when it did not confirm."""
    if noise.negligible:
        return rec
    if not budget.left(runner):
        return None  # an unconfirmed lucky draw is no result to end a study on
    low = _launch_again(runner, rec, against.capacity_rps, noise)
    if (low.capacity_rps or 0.0) >= (against.capacity_rps or 0.0) * (1 - 1e-9):
        return low
    return None


def replicate_baseline(runner: TrialRunner, base: TrialRecord, budget: Budget,
                       noise: LaunchNoise) -> TrialRecord:
    """The baseline launched twice, the lower estimate kept: every later incumbent is the lower of two
    launches too, so the two compare like for like, and a lucky-high first launch of the defaults cannot
    block every real gain. The pair also tells whether the engine is noisy at all."""
    if not base.capacity_rps or not budget.left(runner):
        return base
    return _launch_again(runner, base, base.capacity_rps, noise)


def fitted_baseline(runner: TrialRunner, budget: Budget) -> TrialRecord:
    """vLLM's defaults; where they do not fit this host (a memory utilisation vLLM refused), the defaults
    at the utilisation its numbers leave room for, until one launches: the before/after comparison needs
    a baseline that ran, and it differs from the defaults only in what the host forced."""
    first = runner.evaluate(Knobs(), role="baseline")
    while not first.launched and budget.left(runner):
        fitted = normalize(runner.lessons().repair(first.config, runner.defaults), runner.defaults)
        changed = next(iter(fitted.set_only()), None)
        if fitted == first.config or runner.seen(fitted):
            fitted = fit_to_host(runner, first)
            if fitted is None or runner.seen(fitted):
                break
            changed = next((k for k, v in fitted.set_only().items() if first.knobs.get(k) != v), None)
        first = runner.evaluate(fitted, role="baseline", changed_knob=changed)
    return first


def fit_to_host(runner: TrialRunner, rec: TrialRecord) -> Knobs | None:
    """The smallest change of the space that lets a launch whose model did not fit its GPUs fit, as the
    knobs' own hooks propose it (`KnobSpec.fit_host`, in the table's order: the longest max_model_len
    vLLM's estimate allows, else the next tensor-parallel size). So a baseline is vLLM's defaults with only
    what the host forced changed."""
    knobs = rec.config
    for name, spec in KNOB_SPECS.items():
        if spec.fit_host is None or name not in runner.space.knobs:
            continue
        v = spec.fit_host(getattr(knobs, name), runner.space.knobs[name].values, rec.launch_failure_kind,
                          rec.launch_facts.estimated_max_model_len if rec.launch_facts else None)
        if v is not None:
            return knobs.with_(**{name: v})
    return None

