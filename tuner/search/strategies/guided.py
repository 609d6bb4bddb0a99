"""`--strategy guided`: the product's idea, following the diagnosis.

Diagnose the incumbent's binding constraint from vLLM's metrics, turn the first knob that answers it (the
others held at the incumbent), accept a new incumbent only when its capacity beats the old one by more
than the noise floor, re-diagnose, and stop once `plateau` knobs in a row gave nothing. Candidates race
the incumbent: one load run at the incumbent's capacity decides whether a full knee search is worth it.
"""

from __future__ import annotations

from collections import Counter

from tuner.knobs import Knobs
from tuner.search.runner import TrialRunner
from tuner.search.strategies import StrategyRun, register_strategy
from tuner.search.strategy import (TIE_MARGIN, Budget, LaunchNoise, Outcome, current_value, narrowed, values_toward,
                                   accept_floor, clearly_better_at_same_load, confirm_incumbent,
                                   fitted_baseline, normalize, replicate_baseline)
from tuner.storage.records import Diagnosis, TrialRecord
from tuner.settings import default


@register_strategy("guided", replays_stored=True)
def run(run: StrategyRun) -> Outcome:
    s = run.settings.search
    return guided(run.runner, run.budget, noise_floor=run.settings.noise_floor, plateau=s.plateau,
                  confirm=s.confirm)


def guided(runner: TrialRunner, budget: Budget, *, noise_floor: float, plateau: int | None = None,
           max_visits: int = 2, race_margin: float = 0.0, confirm: bool = True) -> Outcome:
    plateau = default("plateau") if plateau is None else plateau  # declared in `tuner.settings`
    first = fitted_baseline(runner, budget)
    stop = _baseline_stop(first)
    if stop is not None:
        return Outcome(first, None, stop)
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
        inc_knobs = inc.config
        cur = current_value(inc_knobs, knob, runner.defaults)
        lessons = runner.lessons()
        candidates = narrowed(knob, values_toward(cur, runner.space.knobs[knob].values, direction), direction, diag,
                               runner.space.spec_acceptance, cur)
        queue = lessons.allowed(knob, candidates, inc_knobs, runner.defaults)
        best, tried = _try_values(runner, budget, queue, inc, knob, lessons, noise, noise_floor, race_margin,
                                  ordered=direction in ("up", "down") or (len(queue) > 2 and cur is not None))
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


def _baseline_stop(first: TrialRecord) -> str | None:
    """Why the search cannot go on from the baseline `first` (None: it can): no other launch would
    measure or be diagnosed better."""
    if first.launch_failure_kind == "client_bound":  # every other launch would be measured the same way
        return f"the load client could not measure the baseline: {first.launch_failure_message}"
    if first.launch_failure_kind == "requests_failed" and not (first.diagnosis and first.diagnosis.knobs):
        # vLLM's defaults launched and failed nearly every request for a reason no knob answers (a wrong
        # model name, an API key, a broken server): every other launch would fail them too
        return f"the baseline failed its requests: {first.launch_failure_message}"
    if not first.capacity_rps and first.diagnosis is None:
        return "the baseline neither served the SLO at any rate nor told us why"
    return None


def _try_values(runner: TrialRunner, budget: Budget, queue: list, inc: TrialRecord, knob: str, lessons,
                noise: LaunchNoise, noise_floor: float, race_margin: float, *,
                ordered: bool) -> tuple[TrialRecord, int]:
    """Launch `knob`'s values in `queue` (the others held at the incumbent `inc`) while the budget lasts:
    the best of them that beat the incumbent by more than the noise floor (`inc` when none did), and how
    many it launched. `ordered`: the values run one way along a roughly unimodal response, so the loop
    stops past its peak."""
    inc_knobs = inc.config
    best = inc
    misses = 0
    tried = 0
    while queue:
        v = queue.pop(0)
        if not budget.left(runner):
            break
        # a value a failed launch ruled out is replaced by what it allows (the incumbent may be a
        # baseline that never launched: its other knobs are tried at the memory utilisation that fits)
        knobs = _candidate(runner, lessons, inc_knobs, knob, v)
        if knobs is None:
            continue  # impossible, or measured already (the same configuration as another trial)
        floor = accept_floor(best, noise.floor(noise_floor))
        # race at the confirmed incumbent's capacity, not at a sibling's unconfirmed (possibly lucky)
        # estimate: a candidate that fails there cannot be better than what the study stands on
        race = (inc.capacity_rps or 0.0) * (1 + race_margin)
        tried += 1
        if runner.helpers:  # the knob's next values side by side, on the other device sets
            _queue_ahead(runner, budget, queue, inc_knobs, knob, lessons, best.capacity_rps or runner.start_rate)
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
    return best, tried


def _candidate(runner: TrialRunner, lessons, inc_knobs: Knobs, knob: str, value) -> Knobs | None:
    """The incumbent's knobs with `knob` at `value`, repaired by what failed launches taught; None when
    the space rules it out, it was measured already, or a lesson says it breaks."""
    knobs = normalize(lessons.repair(inc_knobs.with_(**{knob: value}), runner.defaults), runner.defaults)
    if runner.space.allows(knobs, runner.defaults) or runner.seen(knobs) or \
            lessons.broken_by(knobs, runner.defaults):
        return None
    return knobs


def _queue_ahead(runner: TrialRunner, budget: Budget, values: list, inc_knobs: Knobs, knob: str, lessons,
                 start_rate: float) -> None:
    """The values of `knob` this loop would try after the one it launches now, queued for the workers of
    the other device sets (`tuner.search.pool`), as many as are free and the budget leaves. The loop
    still decides in its order: a value it reaches is read back, one it never reaches was measured more."""
    free = min(runner.helpers - runner.in_flight(), budget.max_trials - runner.launches - 1 - runner.in_flight())
    ahead: list[tuple[Knobs, float | None]] = []
    for v in values:
        if len(ahead) >= free:
            break
        knobs = _candidate(runner, lessons, inc_knobs, knob, v)
        if knobs is not None:
            ahead.append((knobs, start_rate))
    runner.prefetch(ahead)
