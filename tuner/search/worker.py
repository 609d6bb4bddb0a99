"""Scale-out: several hosts work on one study through a shared database (PostgreSQL).

Configurations are enqueued as Optuna WAITING trials; every worker pops one at a time (the database makes
the pop atomic, so no configuration runs twice), measures it and tells the result. Each running trial
sends heartbeats; when a worker dies, its trial goes stale, Optuna marks it failed and
`RetryFailedTrialCallback` enqueues a copy, which another worker picks up. The grid strategy runs
through the same queue even in one process, which also makes it resumable.
"""

from __future__ import annotations

import time

import optuna
from optuna.trial import TrialState

from tuner.knobs import Knobs
from tuner.search.runner import TrialRunner, knobs_key


def enqueue_grid(runner: TrialRunner) -> int:
    """Enqueue every grid configuration not already in the study (an interrupted trial does not count: its
    configuration is queued again); returns how many were added."""
    layout = runner.space.layout  # the grid's configurations fill the host; a trial's params do not say so
    have = {knobs_key(layout(Knobs(**{k: v for k, v in t.params.items() if v is not None})))
            for t in runner.study.get_trials(deepcopy=False)
            if not (t.state == TrialState.FAIL and (t.user_attrs.get("record") or {}).get("interrupted"))}
    have |= {knobs_key(layout(Knobs(**{k: v for k, v in t.system_attrs.get("fixed_params", {}).items()
                                        if v is not None})))
             for t in runner.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))}
    n = 0
    for knobs in runner.space.iter_grid():
        if knobs_key(knobs) in have:
            continue
        runner.study.enqueue_trial({k: getattr(knobs, k) for k in runner.space.knobs},
                                   user_attrs={"role": "grid"})
        have.add(knobs_key(knobs))
        n += 1
    return n


def work(runner: TrialRunner, *, max_trials: int | None = None, idle_exit_s: float = 5.0,
         poll_s: float = 1.0) -> int:
    """Pop and run WAITING trials until none are left (and none are running elsewhere) for
    `idle_exit_s`. Returns the number of trials this worker ran."""
    ran = 0
    idle_since: float | None = None
    study = runner.study
    while max_trials is None or ran < max_trials:
        waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if not waiting:
            # a stale trial of a dead worker is failed (and re-enqueued) when anyone asks; trigger it
            optuna.storages.fail_stale_trials(study)
            if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                continue  # a dead worker's trial, queued again just now
            running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            now = time.monotonic()
            idle_since = None if running else (idle_since or now)  # idle: nothing queued *or running*
            if not running and now - idle_since >= idle_exit_s:
                break
            time.sleep(poll_s)
            continue
        idle_since = None
        trial = runner.ask()
        if not _from_queue(study, trial):
            # another worker took the last waiting trial between our look and our ask
            study.tell(trial, state=TrialState.FAIL)
            runner.current = None
            continue
        role = trial.user_attrs.get("role", "grid")
        try:
            runner.run_trial(trial, role=role if role in ("grid", "baseline", "candidate") else "grid")
        except KeyboardInterrupt:  # recorded as interrupted; queue the configuration again for others
            attrs = {k: v for k, v in trial.user_attrs.items() if k != "record"}
            study.enqueue_trial(dict(trial.params), user_attrs=attrs, skip_if_exists=False)
            raise
        ran += 1
    return ran


def _from_queue(study: optuna.Study, trial: optuna.Trial) -> bool:
    """Whether `ask` popped an enqueued trial (its `fixed_params` system attribute) rather than creating
    one. Read from the frozen trial: `optuna.Trial` has no public `system_attrs` in Optuna >= 4."""
    frozen = next((t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                   if t.number == trial.number), None)
    return frozen is not None and "fixed_params" in frozen.system_attrs
