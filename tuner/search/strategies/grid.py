"""`--strategy grid`: every configuration of the space, through the trial queue.

The baseline is launched first, as by every strategy; then each configuration not yet in the study is
enqueued as a waiting trial and the queue is worked (`tuner.search.worker`), so `tune worker` processes on
other hosts can share it, and an interrupted grid resumes where it stopped.
"""

from __future__ import annotations

from tuner.knobs import Knobs
from tuner.search.runner import TrialRunner
from tuner.search.strategies import StrategyRun, register_strategy
from tuner.search.strategy import Outcome
from tuner.search.worker import work
from tuner.storage.optuna_study import enqueue, queued_params, stored_params, waiting


@register_strategy("grid")
def run(run: StrategyRun) -> Outcome:
    return grid(run.runner, run.settings.search.max_trials)


def grid(runner: TrialRunner, max_trials: int) -> Outcome:
    """Exhaustive search through the trial queue: `tune worker` processes on other hosts can share it."""
    left_out = 0
    if runner.helpers:
        # workers on the other device sets (`tuner.search.pool`) start on the grid while this process
        # measures the baseline (no grid trial waits on it); the queue is the budget, less the baseline's
        # launch when it is still to run, since they pop it too
        due = 0 if runner.space.layout(Knobs()).key() in runner.finished() else 1
        left_out = enqueue_grid(runner, limit=max(0, max_trials - runner.launches - due), skip_defaults=True)
    base = runner.evaluate(Knobs(), role="baseline")
    if not runner.helpers:
        left_out = enqueue_grid(runner)
    work(runner, max_trials=max(0, max_trials - runner.launches), idle_exit_s=0.0)
    recs = [r for r in runner.finished().values() if r.capacity_rps]
    best = max(recs, key=lambda r: r.capacity_rps, default=None)
    return Outcome(base, best, "grid done" if not waiting(runner.study) and not left_out else "budget spent")


def enqueue_grid(runner: TrialRunner, limit: int | None = None, skip_defaults: bool = False) -> int:
    """Enqueue every grid configuration not already in the study (an interrupted trial does not count: its
    configuration is queued again), or the first `limit` of them; returns how many were left out.
    `skip_defaults`: not vLLM's defaults, which the baseline measures (queued before it has run)."""
    layout = runner.space.layout  # the grid's configurations fill the host; a trial's params do not say so
    have = {layout(Knobs.stored({k: v for k, v in params.items() if v is not None})).key()
            for params in [*stored_params(runner.study), *queued_params(runner.study)]}
    if skip_defaults:
        have.add(layout(Knobs()).key())
    n = left_out = 0
    for knobs in runner.space.iter_grid():
        if knobs.key() in have:
            continue
        if limit is not None and n >= limit:
            left_out += 1
            continue
        enqueue(runner.study, {k: getattr(knobs, k) for k in runner.space.knobs}, {"role": "grid"})
        have.add(knobs.key())
        n += 1
    return left_out
