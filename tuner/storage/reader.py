"""Read a finished (or interrupted) study back from its Optuna storage, and nothing else.

The report, the capacity plan and the regression gate are all rebuilt from the storage alone, so a run
directory copied to another machine, or a PostgreSQL study shared by a team, reports the same way as the
run that wrote it. Layout of a run directory: `study.db` (SQLite) or `storage.txt` (any Optuna storage
URL), and `study_name.txt` (default `slo-tuner`). The study attribute `info` is a `StudyInfo`, each
trial's attribute `record` a `TrialRecord` (see `tuner.storage.records`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from tuner.errors import UserError
from tuner.storage.optuna_study import PREFETCH, STUDY_NAME
from tuner.storage.records import StudyInfo, TrialRecord



class TrialView(BaseModel):
    """One trial as the report sees it: Optuna's state plus the tuner's own record of what happened."""

    number: int
    state: str                      # COMPLETE | PRUNED | FAIL | RUNNING | WAITING
    value: float | None = None
    record: TrialRecord
    #: When Optuna started and finished the trial (Unix seconds; None while it runs): the study's span,
    #: and so the time spent between trials (`tuner.report.time_use`).
    started_unix: float | None = None
    finished_unix: float | None = None

    @property
    def capacity(self) -> float | None:
        return self.record.capacity_rps


class StudyData(BaseModel):
    run_dir: str
    storage_url: str
    study_name: str
    info: StudyInfo
    trials: list[TrialView]
    outcome: dict = {}           # the runner's `outcome` attribute: stop reason, baseline and tuned trial
    twin: dict = {}              # `--strategy twin`: its fits, ranking and predictions (`tuner.storage.twin`)
    shares: dict = {}            # each knob's share of multi-knob steps (`tuner.storage.shares`)
    earned: dict = {}            # the paired check after the search (`tuner.storage.earned`)
    quality_reference: dict = {}  # the baseline's answers the quality check compares with (`tuner.storage.quality`)


def storage_url(run_dir: str | Path) -> str:
    """The Optuna storage URL of a run directory: `storage.txt` if present, else its `study.db`."""
    d = Path(run_dir)
    if not d.exists():
        raise UserError("no such run directory", file=d)
    if not d.is_dir():
        raise UserError("not a run directory (expected a directory with study.db)", file=d)
    txt = d / "storage.txt"
    if txt.exists():
        url = txt.read_text(encoding="utf-8").strip()
        if not url:
            raise UserError("empty storage URL", file=txt)
        return url
    db = d / "study.db"
    if not db.exists():
        raise UserError("no study.db or storage.txt: not a run directory of `tune`", file=d)
    check_optuna_sqlite(db)
    return f"sqlite:///{db.resolve()}"


def check_optuna_sqlite(db: Path) -> None:
    """`db` is an Optuna storage, checked through a read-only connection before Optuna opens it: Optuna's
    storage creates its tables in any SQLite file it is given, so a command that only reads a study (the
    report, the plan, the gate) would otherwise write Optuna's schema into an empty file or another
    tool's database before saying it is not a study."""
    import sqlite3

    if not db.is_file():
        raise UserError("study.db is not a file: not a run directory of `tune`", file=db)
    try:
        con = sqlite3.connect(f"file:{db.resolve()}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            con.close()
    except sqlite3.Error as e:
        raise UserError(f"not an SQLite database ({e}): not a study of `tune`", file=db) from None
    missing = {"studies", "trials", "study_user_attributes"} - tables
    if missing:
        raise UserError("not an Optuna study database (no " + ", ".join(sorted(missing)) + " table): not a "
                        "study of `tune`", file=db)


def study_name(run_dir: str | Path) -> str:
    f = Path(run_dir) / "study_name.txt"
    name = f.read_text(encoding="utf-8").strip() if f.exists() else ""
    return name or STUDY_NAME


def _record(t) -> TrialRecord:
    """The trial's `record`, or a minimal one made from Optuna's state when the trial never wrote one
    (killed before its first load run): a report must show such a trial, not crash on it."""
    raw = t.user_attrs.get("record")
    if raw is not None:
        try:
            rec = TrialRecord.model_validate(raw)
            return rec.model_copy(update={"number": t.number})
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(x) for x in err["loc"])
            raise UserError(f"trial {t.number}: stored record is not a TrialRecord ({where}: {err['msg']})")
    return TrialRecord(number=t.number, role="baseline" if t.number == 0 else "candidate",
                       knobs={k: v for k, v in t.params.items()})


def _not_run_ahead(t: Any) -> bool:
    """A configuration queued ahead for another device set (`tuner.search.ahead`) that the study ended
    before it was measured: not a trial of the search, not shown."""
    rec = t.user_attrs.get("record") or {}
    return bool(t.user_attrs.get(PREFETCH)) and t.state.name == "FAIL" and bool(rec.get("interrupted"))


def load_study_data(run_dir: str | Path) -> StudyData:
    """Everything stored about the study in `run_dir`; a `UserError` when it is not a tuner study."""
    import optuna

    url = storage_url(run_dir)
    name = study_name(run_dir)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.load_study(study_name=name, storage=url)
    except KeyError:
        raise UserError(f"no study named {name!r} in the storage", file=run_dir) from None
    except Exception as e:  # unreachable database, wrong URL scheme, missing driver
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot open the study storage {url}: {first}", file=run_dir) from None
    raw = study.user_attrs.get("info")
    if raw is None:
        raise UserError("the study has no `info` attribute: not written by `tune`", file=run_dir)
    try:
        info = StudyInfo.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        raise UserError(f"study info: {'.'.join(map(str, err['loc']))}: {err['msg']}", file=run_dir) from None
    trials = [TrialView(number=t.number, state=t.state.name, value=t.value, record=_record(t),
                        started_unix=t.datetime_start.timestamp() if t.datetime_start else None,
                        finished_unix=t.datetime_complete.timestamp() if t.datetime_complete else None)
              for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number) if not _not_run_ahead(t)]
    outcome = study.user_attrs.get("outcome")
    return StudyData(run_dir=str(run_dir), storage_url=url, study_name=name, info=info, trials=trials,
                     outcome=outcome if isinstance(outcome, dict) else {},
                     twin=study.user_attrs.get("twin") or {}, shares=study.user_attrs.get("shares") or {},
                     earned=study.user_attrs.get("earned") or {},
                     quality_reference=study.user_attrs.get("quality_reference") or {})
