"""Trials measured ahead on other device sets (`tuner.search.pool`), as the trial runner sees them.

A strategy queues the configurations it expects to ask for next (`prefetch`: Optuna WAITING trials
marked as such); the workers of the other sets pop them. When the strategy then asks for one, the runner
runs it itself if no worker took it yet (`claim_or_wait` takes that very trial), waits for its record if a
worker runs it, and runs it itself if that worker died holding it. At the end what was never taken is
recorded as interrupted (`cancel`), never as measured.

`runner` is the `tuner.search.runner.TrialRunner` that calls these (not imported: it imports this module).
"""

from __future__ import annotations

import time
from typing import Any

import optuna

from tuner import signals
from tuner.knobs import Knobs
from tuner.storage.optuna_study import (DEVICE_SET, EXTRA_KNOBS, PREFETCH, TrialState, claim, enqueue, interrupt,
                                        running, split_knobs, trial_knobs, waiting)

def prefetch(runner: Any, configs: list[tuple[Knobs, float | None]]) -> int:
    """Queue configurations a strategy expects to ask for next (each with the rate its knee search
    starts from), for the workers of the other device sets; none that this process evaluated, that
    is stored or that is queued already. Returns how many were queued."""
    if not runner.helpers:
        return 0
    n = 0
    have = set(runner.finished_all()) | {k for k, _ in pending(runner)}
    for knobs, start in configs:
        knobs = runner.space.layout(knobs)
        key = knobs.key()
        if key in have or runner.served[key]:
            continue
        params, extra = split_knobs(knobs, runner.all_choices())
        enqueue(runner.study, params, {EXTRA_KNOBS: extra, "role": "candidate", PREFETCH: True,
                                     "start_rate": start})
        have.add(key)
        n += 1
    return n


def pending(runner: Any) -> list[tuple[str, Any]]:
    """(key, frozen trial) of each prefetched trial not finished: queued, or running on a worker."""
    out = []
    for t in [*waiting(runner.study), *running(runner.study)]:
        if not t.user_attrs.get(PREFETCH):
            continue
        params = t.system_attrs.get("fixed_params", {})  # what it was queued with, popped or not
        out.append((runner.space.layout(trial_knobs(params, t.user_attrs)).key(), t))
    return out


def claim_or_wait(runner: Any, key: str, poll_s: float = 0.5) -> optuna.Trial | None:
    """The queued trial of `key`, taken to run here; or, when a worker runs it, None once it is told.
    A worker that died holding it (its set's process gone) leaves it interrupted: it is run here."""
    while True:
        signals.check()
        mine = [t for k, t in pending(runner) if k == key]
        if not mine:
            return None
        t = mine[0]
        if t.state == TrialState.WAITING:
            with signals.deferred():
                trial = claim(runner.study, t, runner.all_choices())
                if trial is not None:
                    runner.current = trial
                    return trial
            continue
        holder = t.user_attrs.get(DEVICE_SET)
        if holder is not None and not runner.helper_alive(holder):
            interrupt(runner.study, optuna.Trial(runner.study, t._trial_id))
            continue
        time.sleep(poll_s)


def cancel(runner: Any) -> int:
    """Every queued-ahead trial still waiting is recorded as interrupted (not run; never shown as
    measured). For the end of a study, after the workers stopped."""
    n = 0
    for _, t in pending(runner):
        if t.state != TrialState.WAITING:
            continue
        trial = claim(runner.study, t, runner.all_choices())
        if trial is not None and interrupt(runner.study, trial):
            n += 1
    return n

