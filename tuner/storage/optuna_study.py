"""The one module that talks to Optuna's storage beyond its public API, and opens a run's study.

The search reaches Optuna's trials (enqueue, ask, tell, the queue's states) through the functions here,
so it holds `Knobs` and `TrialRecord`s, never Optuna's trial states or distributions.

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
from optuna.trial import TrialState

from tuner.errors import UserError
from tuner.knobs import Knobs
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


#: The user attribute that carries a trial's knobs outside its Optuna params (`split_knobs`).
EXTRA_KNOBS = "extra_knobs"
#: A trial queued ahead for a worker of another device set (`TrialRunner.prefetch`), and the set that ran it.
PREFETCH = "prefetch"
DEVICE_SET = "device_set"


def split_knobs(knobs: Knobs, choices: dict[str, list]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A configuration in the two parts Optuna stores it as: the params (each knob of the space whose value
    is one of its categorical `choices`) and the `extra_knobs` user attribute (the rest that is set)."""
    params = {k: getattr(knobs, k) for k, c in choices.items() if getattr(knobs, k) in c}
    return params, {k: v for k, v in knobs.set_only().items() if k not in params}


def trial_knobs(params: dict[str, Any], user_attrs: dict[str, Any]) -> Knobs:
    """The configuration a trial was asked for, from its two stored parts (`split_knobs`)."""
    return Knobs.stored({**{k: v for k, v in params.items() if v is not None}, **user_attrs.get(EXTRA_KNOBS, {})})


def close_orphans(study: optuna.Study) -> int:
    """Mark trials left RUNNING by a killed tool as interrupted (FAIL), so they are re-run, not shown as
    running forever. Only for SQLite, which one tool uses at a time and which has no heartbeats to time
    them out; on a shared database a RUNNING trial may be another worker's (heartbeats handle those)."""
    return sum(interrupt(study, optuna.Trial(study, t._trial_id)) for t in running(study))


def interrupt(study: optuna.Study, trial: optuna.Trial) -> bool:
    """Record a RUNNING trial as interrupted (FAIL, with a record of its configuration, so it is re-run);
    False when it had ended already. Its role and configuration are read from what it was asked with."""
    frozen = frozen_trial(study, trial)
    if frozen.state != TrialState.RUNNING:
        return False
    knobs = trial_knobs(frozen.params, frozen.user_attrs).set_only()
    rec = TrialRecord(number=frozen.number, role=stored_role(frozen.user_attrs, knobs), knobs=knobs,
                      interrupted=True)
    trial.set_user_attr("record", rec.model_dump(mode="json"))
    study.tell(trial, state=TrialState.FAIL)
    return True


# -- the search's trials: enqueue, ask, tell (the search layer reaches Optuna's trial API only here) -----
def enqueue(study: optuna.Study, params: dict[str, Any], user_attrs: dict[str, Any]) -> None:
    """Queue a configuration as a WAITING trial (`ask` pops it; a worker on another host may)."""
    study.enqueue_trial(params, user_attrs=user_attrs, skip_if_exists=False)


def ask(study: optuna.Study, choices: dict[str, list[Any]] | None) -> optuna.Trial:
    """A new trial, or the next queued one; `choices`: each knob's categorical values ({}: none fixed)."""
    return study.ask({k: optuna.distributions.CategoricalDistribution(v) for k, v in (choices or {}).items()})


def ask_new(study: optuna.Study) -> optuna.Trial:
    """A new trial for the study's sampler to fill, never one from the queue: where workers pop the queue
    (`tuner.search.pool`), `ask` would hand back the oldest waiting trial, a configuration meant for one
    of them. Made as `ask` makes a trial when nothing waits (the sampler told first)."""
    trial_id = study._storage.create_new_trial(study._study_id)
    study.sampler.before_trial(study, study._storage.get_trial(trial_id))
    return optuna.Trial(study, trial_id)


def tell(study: optuna.Study, trial: optuna.Trial, record: TrialRecord, state: TrialState) -> None:
    """A trial's record and its end state (COMPLETE: the capacity is its value)."""
    trial.set_user_attr("record", record.model_dump(mode="json"))
    if state == TrialState.COMPLETE:
        study.tell(trial, record.capacity_rps or 0.0)
    else:
        study.tell(trial, state=state)


def prune(study: optuna.Study, trial: optuna.Trial) -> None:
    """End a trial a strategy asked for and will not run (a configuration seen or ruled out)."""
    study.tell(trial, state=TrialState.PRUNED)


def fail(study: optuna.Study, trial: optuna.Trial) -> None:
    """End a trial that was asked by mistake (a worker whose queued trial another worker took first)."""
    study.tell(trial, state=TrialState.FAIL)


def use_sampler(study: optuna.Study, kind: str, grid: dict[str, list[Any]], seed: int) -> None:
    """The sampler that proposes the next trials: `tpe`, `random` or `grid` (over `grid`'s values)."""
    if kind == "grid":
        study.sampler = optuna.samplers.GridSampler(grid, seed=seed)
    elif kind == "random":
        study.sampler = optuna.samplers.RandomSampler(seed=seed)
    else:
        study.sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)


def finished_records(study: optuna.Study) -> list[TrialRecord]:
    """Records of the trials that ended (complete, raced out, failed to launch), in trial order; an
    interrupted trial is left out (it is run again)."""
    out = []
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        rec = t.user_attrs.get("record")
        if rec is None or t.state in (TrialState.RUNNING, TrialState.WAITING):
            continue
        r = TrialRecord(**rec)
        if not r.interrupted:
            out.append(r)
    return out


def waiting(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.WAITING,))


def running(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))


def stored_params(study: optuna.Study) -> list[dict[str, Any]]:
    """The configurations of every trial but an interrupted one (its configuration is to be run again)."""
    return [t.params for t in study.get_trials(deepcopy=False)
            if not (t.state == TrialState.FAIL and (t.user_attrs.get("record") or {}).get("interrupted"))]


def queued_params(study: optuna.Study) -> list[dict[str, Any]]:
    """The configurations waiting in the queue (a WAITING trial's params are its `fixed_params`)."""
    return [t.system_attrs.get("fixed_params", {}) for t in waiting(study)]


def retry_stale(study: optuna.Study) -> None:
    """Fail (and so re-enqueue) the trials of workers whose heartbeats stopped: Optuna does it when asked."""
    optuna.storages.fail_stale_trials(study)


def from_queue(study: optuna.Study, trial: optuna.Trial) -> bool:
    """Whether `ask` popped an enqueued trial (its `fixed_params` system attribute) rather than creating
    one. Read from the frozen trial: `optuna.Trial` has no public `system_attrs` in Optuna >= 4."""
    frozen = next((t for t in running(study) if t.number == trial.number), None)
    return frozen is not None and "fixed_params" in frozen.system_attrs


def start_trial(study: optuna.Study, params: dict[str, Any], user_attrs: dict[str, Any],
                choices: dict[str, list[Any]]) -> optuna.Trial:
    """A new RUNNING trial of these params, never through the queue: where workers pop the queue
    (`tuner.search.pool`), a configuration enqueued to be asked for here could be taken by one of them,
    and `ask` would pop the oldest waiting trial, which may be another. Created in one write, as `ask`
    creates a trial when nothing waits (Optuna's storage API)."""
    dists = {k: optuna.distributions.CategoricalDistribution(v) for k, v in choices.items()}
    frozen = optuna.trial.create_trial(
        state=TrialState.RUNNING, params={k: params[k] for k in dists if k in params},
        distributions={k: d for k, d in dists.items() if k in params}, user_attrs=user_attrs)
    trial_id = study._storage.create_new_trial(study._study_id, template_trial=frozen)
    return optuna.Trial(study, trial_id)


def claim(study: optuna.Study, frozen: optuna.trial.FrozenTrial, choices: dict[str, list[Any]]) -> optuna.Trial | None:
    """Take one particular WAITING trial to run here (None: a worker took it first). `ask` pops the oldest;
    this takes the one asked for, as atomically (Optuna's own pop sets RUNNING the same way), and gives it
    its queued params through the public suggest API, as `ask` would."""
    try:
        if not study._storage.set_trial_state_values(frozen._trial_id, state=TrialState.RUNNING):
            return None
    except optuna.exceptions.UpdateFinishedTrialError:
        return None
    trial = optuna.Trial(study, frozen._trial_id)
    for k, v in choices.items():
        trial.suggest_categorical(k, v)
    return trial


def requeue(study: optuna.Study, trial: optuna.Trial) -> None:
    """Queue an interrupted trial's configuration again, for another worker."""
    enqueue(study, dict(trial.params), {k: v for k, v in trial.user_attrs.items() if k != "record"})


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
