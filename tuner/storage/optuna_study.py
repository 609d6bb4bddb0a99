"""The one module that talks to Optuna's storage beyond its public API, and opens a run's study.

Optuna has no public way to send heartbeats for trials run through ask/tell, to read a trial's frozen
state from its live `Trial`, or to re-attach to a RUNNING trial a killed tool left behind; the three places
that need one are here, each saying which private name it uses, so an Optuna upgrade is checked here.
"""

from __future__ import annotations

import inspect
import os
import warnings
from contextlib import contextmanager
from typing import Any, Iterator

import optuna

from tuner.errors import UserError
from tuner.storage.records import TrialRecord

#: The study's name inside its storage (a run directory's `study_name.txt` may name another).
STUDY_NAME = "slo-tuner"


def stored_role(user_attrs: dict, knobs: dict) -> str:
    """The role a trial was asked in (a user attribute), for a trial whose record was never written."""
    roles = TrialRecord.model_fields["role"].annotation.__args__
    role = user_attrs.get("role")
    return role if role in roles else ("baseline" if not knobs else "candidate")


def _env_seconds(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise UserError(f"must be a whole number of seconds >= 1, got {raw!r}", field=name)
    return value


def open_study(url: str, *, create: bool, resume: bool) -> optuna.Study:
    """Shared databases get heartbeats: a trial silent for the grace period (its worker died) is failed
    and retried. Interval and grace: env TUNER_HEARTBEAT_S (30) and TUNER_HEARTBEAT_GRACE_S (3x)."""
    heartbeat = None if url.startswith("sqlite") else _env_seconds("TUNER_HEARTBEAT_S", 30)
    grace = _env_seconds("TUNER_HEARTBEAT_GRACE_S", 3 * heartbeat) if heartbeat else None
    # Heartbeats, stale trials and their retry are all "experimental" in Optuna, and ask/tell with
    # heartbeats "should use optimize": warnings on every run that a user can do nothing about.
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with")
    retry: dict[str, Any] = {}
    if heartbeat:  # Optuna 4.9 renamed the retry callback and its argument; the old names go in 6.0
        cls = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
        new_arg = "heartbeat_stale_trial_callback" in inspect.signature(optuna.storages.RDBStorage).parameters
        retry = {("heartbeat_stale_trial_callback" if new_arg else "failed_trial_callback"):
                 (cls or optuna.storages.RetryFailedTrialCallback)(max_retry=2)}
    try:
        storage = optuna.storages.RDBStorage(
            url, heartbeat_interval=heartbeat, grace_period=grace, **retry,
            engine_kwargs={"connect_args": {"timeout": 30}} if url.startswith("sqlite") else {})
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    except Exception as e:  # noqa: BLE001  (a damaged file, an old schema, a driver's refusal: the user's)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise UserError(f"cannot open the study storage: {first}", field="--storage") from None
    if STUDY_NAME in names and create and not resume:
        raise UserError("a study already exists here: pass --resume to continue it, or another --out",
                        field="--out")
    if STUDY_NAME not in names and (resume or not create):
        raise UserError("no study in this storage to continue", field="--resume" if create else "--storage")
    if STUDY_NAME in names:  # loaded, not "created": Optuna's "Using an existing study" line is no news
        return optuna.load_study(study_name=STUDY_NAME, storage=storage)
    return optuna.create_study(study_name=STUDY_NAME, storage=storage, direction="maximize",
                               load_if_exists=True)


def close_orphans(study: optuna.Study) -> int:
    """Mark trials left RUNNING by a killed tool as interrupted (FAIL), so they are re-run, not shown as
    running forever. Only for SQLite, which one tool uses at a time and which has no heartbeats to time
    them out; on a shared database a RUNNING trial may be another worker's (heartbeats handle those)."""
    from optuna.trial import TrialState

    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        knobs = {**{k: v for k, v in t.params.items() if v is not None}, **t.user_attrs.get("extra_knobs", {})}
        rec = TrialRecord(number=t.number, role=stored_role(t.user_attrs, knobs), knobs=knobs, interrupted=True)
        trial = optuna.Trial(study, t._trial_id)
        trial.set_user_attr("record", rec.model_dump(mode="json"))
        study.tell(trial, state=TrialState.FAIL)
        n += 1
    return n


@contextmanager
def heartbeats(study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    """Optuna sends a trial's heartbeats only inside `Study.optimize`; trials run through ask/tell (all of
    ours) got none, and a trial without heartbeats is never found stale, so a dead worker's trial stayed
    RUNNING forever and was never retried. A no-op for storages without a heartbeat (SQLite)."""
    from optuna.storages._heartbeat import get_heartbeat_thread  # private: no public API for ask/tell

    with get_heartbeat_thread(trial._trial_id, study._storage):
        yield


def frozen_trial(study: optuna.Study, trial: optuna.Trial) -> optuna.trial.FrozenTrial:
    """The stored state of a live trial (private: `Study._storage`, `Trial._trial_id`)."""
    return study._storage.get_trial(trial._trial_id)


def scratch_study(direction: str, sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    """An in-memory study for a search inside the tool (the twin's fit and its ranking of the space): its
    creation is no news to the user, so Optuna's "A new study created in memory" line is not printed
    (between two trials of the run's progress it read as a second study)."""
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(max(level, optuna.logging.WARNING))
    try:
        return optuna.create_study(direction=direction, sampler=sampler)
    finally:
        optuna.logging.set_verbosity(level)
