"""After the search: measure what the recommendation rests on, paired, so that every knob in it is earned.

The search (any strategy) ends on its best configuration, measured by a knee search whose capacity
carries its own path's noise. Before anything is recommended, this phase launches, on the study's
common windows (`tuner.capacity.windows`: the same requests, arrivals and rates for each):

1. vLLM's defaults and the search's best. If the best's paired gain does not count
   (`tuner.recommend.gain_counts`), that is the answer (keep the defaults) and nothing more is launched.
2. Each knob the best changed, in `tuner.recommend.removal_order`: the configuration without it. A knob
   whose removal costs nothing significant (`tuner.recommend.knob_earns`) is dropped, and the next knob is
   tried on the smaller configuration.
3. The configuration left must still count against the defaults; if the drops together cost too much, the
   smallest configuration of the removal chain that counts is kept.

A comparison stops adding windows once more could not change its answer (`tuner.recommend.gain_settled`,
`share_settled`); a configuration that goes on to be compared again (a knob dropped) is then measured on
the windows it missed, in a second launch. Launches here are beyond `--max-trials` (the search's budget)
and stop with `--time-budget`. Measuring is the runner's and deciding `tuner.recommend`'s; this module
only chooses what to measure next from what they say. The log is stored as the study attribute `earned`
(`tuner.storage.earned`); a resumed study reads every paired launch back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable

from tuner.capacity.paired import TEST, paired_ratio
from tuner.capacity.windows import WindowPlan
from tuner.knobs import Knobs
from tuner.recommend import changed_knobs, gain_counts, gain_settled, knob_earns, removal_order, share_settled
from tuner.search.attribute import without  # `knobs` with one knob as in the defaults' launch
from tuner.search.runner import TrialRunner
from tuner.search.strategy import Budget, Outcome
from tuner.storage.earned import ATTR, EarnedLog, RemovalStep
from tuner.storage.records import WindowCapacity


@dataclass
class Paired:
    """One configuration on the common windows: its paired trials and their windows together."""

    knobs: dict
    trials: list[int] = field(default_factory=list)
    windows: list[WindowCapacity] = field(default_factory=list)
    launched: bool = True
    capacity_rps: float | None = None


class _Check:
    """The phase's launches, within the time budget, logged."""

    def __init__(self, runner: TrialRunner, budget: Budget, plan: WindowPlan, log: EarnedLog,
                 say: Callable[[str], None]):
        self.runner, self.budget, self.plan, self.log, self.say = runner, budget, plan, log, say
        self.start: float | None = None  # every configuration's windows start here (vLLM's defaults' knee)

    def measure(self, knobs: dict, what: str,
                enough: Callable[[list[WindowCapacity]], bool] | None = None) -> Paired | None:
        if self.budget.time_budget_s and time.monotonic() - self.budget.started > self.budget.time_budget_s:
            self.log.note = "the time budget ran out before the paired check finished"
            return None
        self.say(f"paired check: {what} on up to {len(self.plan.seeds)} common request windows")
        rec = self.runner.evaluate(Knobs.stored(knobs), windows=self.plan, start_rate=self.start, enough=enough)
        return Paired(knobs=dict(rec.knobs), trials=[rec.number], windows=list(rec.windows),
                      launched=rec.launched, capacity_rps=rec.capacity_rps)

    def complete(self, p: Paired) -> Paired | None:
        """`p` on the windows of the plan it has not been measured on (a second launch)."""
        done = {w.seed for w in p.windows}
        missing = tuple(s for s in self.plan.seeds if s not in done)
        if not missing or not p.launched:
            return p
        if self.budget.time_budget_s and time.monotonic() - self.budget.started > self.budget.time_budget_s:
            self.log.note = "the time budget ran out before the paired check finished"
            return None
        self.say(f"paired check: the same on the {len(missing)} windows it was not measured on")
        rec = self.runner.evaluate(Knobs.stored(p.knobs), windows=replace(self.plan, seeds=missing),
                                   start_rate=self.start, fresh=True)
        order = {s: i for i, s in enumerate(self.plan.seeds)}
        windows = sorted(p.windows + list(rec.windows), key=lambda w: order.get(w.seed, len(order)))
        return Paired(knobs=p.knobs, trials=p.trials + [rec.number], windows=windows, launched=True,
                      capacity_rps=p.capacity_rps)


def earn(runner: TrialRunner, budget: Budget, outcome: Outcome, plan: WindowPlan, *, floor: float,
         say: Callable[[str], None] = lambda m: None) -> EarnedLog | None:
    """The phase of the module docstring; None when there is nothing to compare (no baseline capacity or
    no incumbent)."""
    base, best = outcome.baseline, outcome.incumbent
    if base is None or best is None or not base.capacity_rps:
        return None
    log = EarnedLog(floor=floor, test=TEST, window_seeds=list(plan.seeds), grid_step=plan.step,
                    best_source_trial=best.number)
    counted = runner.launches
    check = _Check(runner, budget, plan, log, say)
    check.start = base.capacity_rps
    d = check.measure(base.knobs, "vLLM's defaults")
    if d is None or not d.launched:
        return _store(runner, log, counted)
    log.defaults_trials = d.trials
    if not changed_knobs(best.knobs, runner.defaults) or best.number == base.number:
        return _store(runner, log, counted)
    b = check.measure(best.knobs, f"the search's best (trial {best.number})",
                      lambda ws: gain_settled(paired_ratio(ws, d.windows), floor))
    if b is None:
        return _store(runner, log, counted)
    log.best_trials = b.trials
    gain = paired_ratio(b.windows, d.windows)
    say(f"paired check: the search's best against the defaults: {gain.text() if gain else 'n/a'}")
    if not gain_counts(gain, floor):
        return _store(runner, log, counted)
    b = check.complete(b)  # every knob is compared against it: on every window
    if b is None:
        return _store(runner, log, counted)
    log.best_trials = b.trials
    chain = _remove_knobs(check, b, base.knobs, floor)
    for cand in reversed(chain):  # the smallest configuration of the chain that still counts
        if gain_counts(paired_ratio(cand.windows, d.windows), floor):
            log.final_trials = cand.trials
            break
    return _store(runner, log, counted)


def _remove_knobs(check: _Check, best: Paired, base: dict, floor: float) -> list[Paired]:
    """Step 2 of the module docstring: the chain of configurations from the best to the smallest whose
    every knob earned its place."""
    defaults = check.runner.defaults
    chain, current = [best], best
    for knob in removal_order(changed_knobs(best.knobs, defaults)):
        if knob not in changed_knobs(current.knobs, defaults):
            continue
        with_ = current
        w = check.measure(without(current.knobs, base, knob), f"without {knob}",
                          lambda ws: share_settled(knob, paired_ratio(with_.windows, ws), floor))
        if w is None:
            break
        share = paired_ratio(current.windows, w.windows) if w.launched else None
        kept = not w.launched or knob_earns(knob, share, floor)
        if not kept:
            w = check.complete(w)  # compared again from here on: on every window
            if w is None:
                break
        check.log.steps.append(RemovalStep(knob=knob, with_trials=current.trials, without_trials=w.trials,
                                           kept=kept, note="" if w.launched else
                                           "the configuration without it did not launch"))
        check.say(f"paired check: {knob} {'earns its place' if kept else 'dropped'}: "
                  f"{share.text() if share else 'n/a'}")
        if not kept:
            current = w
            chain.append(w)
    return chain


def _store(runner: TrialRunner, log: EarnedLog, counted: int) -> EarnedLog:
    log.launches = runner.launches - counted
    runner.study.set_user_attr(ATTR, log.model_dump(mode="json"))
    return log
