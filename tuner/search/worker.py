"""Scale-out: several hosts work on one study through a shared database (PostgreSQL).

Configurations are enqueued as Optuna WAITING trials; every worker pops one at a time (the database makes
the pop atomic, so no configuration runs twice), measures it and tells the result. Each running trial
sends heartbeats; when a worker dies, its trial goes stale, Optuna marks it failed and
`RetryFailedTrialCallback` enqueues a copy, which another worker picks up. The grid strategy runs
through the same queue even in one process, which also makes it resumable (`tuner.search.strategies.grid`).
"""

from __future__ import annotations

import time

from tuner.search.runner import TrialRunner
from tuner.storage.optuna_study import PREFETCH, fail, from_queue, requeue, retry_stale, running, waiting


def work(runner: TrialRunner, *, max_trials: int | None = None, idle_exit_s: float = 5.0,
         poll_s: float = 0.2) -> int:
    """Pop and run WAITING trials until none are left (and none are running elsewhere) for
    `idle_exit_s`. Returns the number of trials this worker ran. An idle worker looks at the queue every
    `poll_s` (a few cheap queries): a simulated trial can take a tenth of a second, and a worker that
    looked once a second would find the queue emptied by the set that queued it."""
    ran = 0
    idle_since: float | None = None
    study = runner.study
    while max_trials is None or ran < max_trials:
        if not waiting(study):
            # a stale trial of a dead worker is failed (and re-enqueued) when anyone asks; trigger it
            retry_stale(study)
            if waiting(study):
                continue  # a dead worker's trial, queued again just now
            busy = running(study)
            now = time.monotonic()
            idle_since = None if busy else (idle_since or now)  # idle: nothing queued *or running*
            if not busy and now - idle_since >= idle_exit_s:
                break
            time.sleep(poll_s)
            continue
        idle_since = None
        trial = runner.ask()
        if not from_queue(study, trial):
            # another worker took the last waiting trial between our look and our ask
            fail(study, trial)
            runner.current = None
            continue
        role = trial.user_attrs.get("role", "grid")
        try:
            # a trial queued ahead by a strategy (`TrialRunner.prefetch`) starts its knee search where
            # the strategy expects the capacity, and leaves judging it to the strategy
            runner.run_trial(trial, role=role if role in ("grid", "baseline", "candidate") else "grid",
                             start_rate=trial.user_attrs.get("start_rate"),
                             prefetched=bool(trial.user_attrs.get(PREFETCH)))
        except KeyboardInterrupt:  # recorded as interrupted; queue the configuration again for others
            requeue(study, trial)
            raise
        ran += 1
    return ran
