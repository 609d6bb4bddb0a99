"""How the next configuration is chosen.

`guided` (the default) is the product's idea: diagnose the incumbent's binding constraint from vLLM's
metrics, turn the first knob that answers it (the others held at the incumbent), accept a new incumbent
only when its capacity beats the old one by more than the noise floor, re-diagnose, and stop once
`plateau` knobs in a row gave nothing. Candidates race the incumbent: one load run at the incumbent's
capacity decides whether a full knee search is worth it.

`twin` (`tuner.search.twin`) ranks the whole space in a simulator fitted to this engine's launches and
spends launches only on verifying its best.

`tpe`, `random` and `grid` search the whole space blind (what peer tools do), for comparison and for users
who want them; they share the same trial runner and storage.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import optuna

from tuner.knobs import KNOB_SPECS, Knobs
from tuner.storage.records import Diagnosis, TrialRecord
from tuner.search.runner import TrialRunner, knobs_key

STRATEGIES = ("guided", "twin", "tpe", "random", "grid")


@dataclass
class Budget:
    max_trials: int = 15
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


def _order(value: Any, values: list[Any], direction: str) -> list[Any]:
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


def _can_bind(knob: str, values: list[Any], direction: str, diag: Diagnosis | None) -> list[Any]:
    """Drop the lower batch caps that cannot change the run: a `max_num_seqs` at or above twice the batch
    that ran at the failing point (p90) never limits it, so launching it measures the incumbent again. (On
    chat with a strict TPOT on an RTX 4090 the knee runs 7 sequences: 128 and 64 were two wasted launches.)"""
    running = diag.evidence.get("running_p90") if diag else None
    if knob != "max_num_seqs" or direction != "down" or not isinstance(running, (int, float)) or running <= 0:
        return values
    return [v for v in values if not isinstance(v, (int, float)) or v < 2 * running]


def _for_batch(knob: str, values: list[Any], diag: Diagnosis | None, stated: dict[str, float],
               current: Any) -> list[Any]:
    """Speculative configs in the order worth trying at the batch the knee runs at: the draft length
    (and method) with the largest expected gain first, the ones expected to lose dropped
    (`tuner.speculative.order_for_batch`). The acceptance rate an incumbent with speculation measured is
    used for its own method; other methods take the stated rate or the prior."""
    from tuner.speculative import parse as parse_spec, order_for_batch

    running = diag.evidence.get("running_p90") if diag else None
    if knob != "speculative_config" or not isinstance(running, (int, float)):
        return values
    measured = diag.evidence.get("spec_acceptance_rate") if diag else None
    rates = dict(stated)
    if isinstance(measured, float) and current:
        rates[parse_spec(current).method] = measured
    specs = [v for v in values if v is not None]
    return order_for_batch(specs, running, stated=rates) + [v for v in values if v is None]


def normalize(knobs: Knobs, defaults: dict[str, Any]) -> Knobs:
    """Unset the knobs whose value is vLLM's default: `--kv-cache-dtype auto` is the baseline."""
    always = {k: spec.neutral for k, spec in KNOB_SPECS.items() if spec.neutral is not None}
    keep = {k: v for k, v in knobs.set_only().items() if {**always, **defaults}.get(k, object()) != v}
    return Knobs(**keep)


def _current(knobs: Knobs, name: str, defaults: dict[str, Any]) -> Any:
    v = getattr(knobs, name)
    if v is None:
        return {"kv_cache_dtype": "auto", **defaults}.get(name)
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
    again = runner.evaluate(Knobs(**rec.knobs), role="confirm", changed_knob=rec.changed_knob,
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
        fitted = normalize(runner.lessons().repair(Knobs(**first.knobs), runner.defaults), runner.defaults)
        changed = next(iter(fitted.set_only()), None)
        if fitted == Knobs(**first.knobs) or runner.seen(fitted):
            fitted = fit_to_host(runner, first)
            if fitted is None or runner.seen(fitted):
                break
            changed = next((k for k, v in fitted.set_only().items() if first.knobs.get(k) != v), None)
        first = runner.evaluate(fitted, role="baseline", changed_knob=changed)
    return first


_ESTIMATED_LEN = re.compile(r"estimated maximum model length is (\d+)")


def fit_to_host(runner: TrialRunner, rec: TrialRecord) -> Knobs | None:
    """The smallest change of the space that lets a launch whose model did not fit its GPUs fit: where
    one request of max_model_len did not fit the KV pool, the space's longest max_model_len vLLM's own
    estimate allows (the study refused any value below the workload's longest request); else, where the
    weights or that KV did not fit, the next tensor-parallel size (a 70B model in BF16 needs at least two
    80 GB GPUs). So a baseline is vLLM's defaults with only what the host forced changed."""
    kind, knobs = rec.launch_failure_kind, Knobs(**rec.knobs)
    m = _ESTIMATED_LEN.search(rec.launch_failure_message or "")
    if kind == "max_model_len" and m and "max_model_len" in runner.space.knobs:
        fits = [v for v in runner.space.knobs["max_model_len"].values
                if v is not None and v <= int(m.group(1)) and v != knobs.max_model_len]
        if fits:
            return knobs.with_(max_model_len=max(fits))
    if kind not in ("oom", "max_model_len", "no_cache_blocks") or "tensor_parallel_size" not in runner.space.knobs:
        return None
    cur = knobs.tensor_parallel_size or 1
    wider = sorted(v for v in runner.space.knobs["tensor_parallel_size"].values if v is not None and v > cur)
    return knobs.with_(tensor_parallel_size=wider[0]) if wider else None


def guided(runner: TrialRunner, budget: Budget, *, noise_floor: float, plateau: int = 3,
           max_visits: int = 2, race_margin: float = 0.0, confirm: bool = True) -> Outcome:
    first = fitted_baseline(runner, budget)
    if first.launch_failure_kind == "client_bound":  # every other launch would be measured the same way
        return Outcome(first, None, f"the load client could not measure the baseline: {first.launch_failure_message}")
    if first.launch_failure_kind == "requests_failed" and not (first.diagnosis and first.diagnosis.knobs):
        # vLLM's defaults launched and failed nearly every request for a reason no knob answers (a wrong
        # model name, an API key, a broken server): every other launch would fail them too
        return Outcome(first, None, f"the baseline failed its requests: {first.launch_failure_message}")
    if not first.capacity_rps and first.diagnosis is None:
        return Outcome(first, None, "the baseline neither served the SLO at any rate nor told us why")
    noise = LaunchNoise()
    base = inc = replicate_baseline(runner, first, budget, noise) if confirm else first
    runner.compare_rate = base.capacity_rps
    chain = [base.number]
    runner.reporter.incumbent_changed(inc)
    visits: Counter[str] = Counter()
    done_for: set[tuple[str, int]] = set()  # (knob, incumbent trial) pairs already explored
    streak = 0
    while budget.left(runner):
        diag: Diagnosis | None = inc.diagnosis
        wanted = [k for k in (diag.knobs if diag else []) if k in runner.space.knobs]
        order = [k for k in wanted if visits[k] < max_visits and (k, inc.number) not in done_for]
        if not order:  # nothing the diagnosis names is left: explore the rest of the space once
            order = [k for k in runner.space.knobs if visits[k] == 0]
        if not order:
            return Outcome(base, inc, "every knob tried: plateau", chain)
        knob = order[0]
        direction = (diag.directions.get(knob, "any") if diag and knob in wanted else "any")
        inc_knobs = Knobs(**inc.knobs)
        cur = _current(inc_knobs, knob, runner.defaults)
        lessons = runner.lessons()
        candidates = _can_bind(knob, _order(cur, runner.space.knobs[knob].values, direction), direction, diag)
        candidates = _for_batch(knob, candidates, diag, runner.space.spec_acceptance, cur)
        queue = lessons.allowed(knob, candidates, inc_knobs, runner.defaults)
        best = inc
        misses = 0
        ordered = direction in ("up", "down") or (len(queue) > 2 and cur is not None)
        tried = 0
        while queue:
            v = queue.pop(0)
            if not budget.left(runner):
                break
            # a value a failed launch ruled out is replaced by what it allows (the incumbent may be a
            # baseline that never launched: its other knobs are tried at the memory utilisation that fits)
            knobs = normalize(lessons.repair(inc_knobs.with_(**{knob: v}), runner.defaults), runner.defaults)
            if runner.space.allows(knobs, runner.defaults) or runner.seen(knobs) or \
                    lessons.broken_by(knobs, runner.defaults):
                continue  # impossible, or measured already (the same configuration as another trial)
            floor = accept_floor(best, noise.floor(noise_floor))
            # race at the confirmed incumbent's capacity, not at a sibling's unconfirmed (possibly lucky)
            # estimate: a candidate that fails there cannot be better than what the study stands on
            race = (inc.capacity_rps or 0.0) * (1 + race_margin)
            tried += 1
            rec = runner.evaluate(knobs, changed_knob=knob, incumbent=inc.capacity_rps,
                                  race_rate=race if inc.capacity_rps else None,
                                  start_rate=best.capacity_rps or runner.start_rate,
                                  accept_above=floor if best.capacity_rps else None,
                                  accept=lambda r, b=best: clearly_better_at_same_load(r, b, TIE_MARGIN))
            if rec.learned:  # the host refused a value: drop what it rules out, try what it suggests
                lessons = runner.lessons()
                queue = lessons.allowed(knob, queue, inc_knobs, runner.defaults)
                continue
            if rec.accepted:
                best = rec
                misses = 0
            else:
                misses += 1
                if ordered and (best is not inc or misses >= 2):
                    break  # past the peak of a one-dimensional, roughly unimodal response
        visits[knob] += 1
        done_for.add((knob, inc.number))
        if not tried:
            continue  # nothing to try for this knob (already at its best value): not a miss
        confirmed = None if best is inc else (
            confirm_incumbent(runner, best, budget, inc, noise) if confirm else best)
        if confirmed is not None:
            inc = confirmed
            chain.append(inc.number)
            runner.reporter.incumbent_changed(inc)
            streak = 0
        else:
            streak += 1
            if streak >= plateau and (not diag or all(visits[k] for k in wanted)):
                return Outcome(base, inc, f"plateau: {plateau} knobs in a row gave no gain above the "
                                          f"{noise.floor(noise_floor):.0%} noise floor"
                                          f"{' (the baseline measured alike on two launches)' if noise.negligible else ''}",
                               chain)
    return Outcome(base, inc, "budget spent", chain)


def whole_space(runner: TrialRunner, budget: Budget, *, sampler: str, noise_floor: float,
                seed: int = 0, race: bool = False) -> Outcome:
    """Peer-style blind search over the whole space, after the same baseline trial."""
    base = fitted_baseline(runner, budget)
    if base.launch_failure_kind == "client_bound":
        return Outcome(base, None, f"the load client could not measure the baseline: {base.launch_failure_message}")
    if base.launch_failure_kind == "requests_failed" and not (base.diagnosis and base.diagnosis.knobs):
        return Outcome(base, None, f"the baseline failed its requests: {base.launch_failure_message}")
    best = base if base.capacity_rps else None
    if sampler == "grid":
        search_space = {k: [v for v in runner.choices(k) if v is not None] or [None]
                        for k in runner.space.knobs}
        runner.study.sampler = optuna.samplers.GridSampler(search_space, seed=seed)
    elif sampler == "random":
        runner.study.sampler = optuna.samplers.RandomSampler(seed=seed)
    else:
        runner.study.sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)
    seen = set(runner.finished())
    stale = 0
    while budget.left(runner) and stale < 50:
        trial = runner.ask({})
        picked = {k: trial.suggest_categorical(k, runner.choices(k)) for k in runner.space.knobs}
        knobs = runner.space.layout(Knobs(**{k: v for k, v in picked.items() if v is not None}))
        if knobs_key(knobs) in seen or runner.space.allows(knobs, runner.defaults) or \
                runner.lessons().broken_by(knobs, runner.defaults):
            runner.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            runner.current = None
            stale += 1
            continue
        stale = 0
        seen.add(knobs_key(knobs))
        floor = accept_floor(best, noise_floor) if best else None
        rec = runner.run_trial(trial, role=sampler, race_rate=floor if race else None,
                               start_rate=(best.capacity_rps if best else None),
                               incumbent=best.capacity_rps if best else None, accept_above=floor)
        if rec.accepted:
            best = rec
    return Outcome(base, best, "budget spent" if stale < 50 else "space exhausted")
