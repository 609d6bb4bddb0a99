"""Checks of where a study will live, made before its run directory or its database is created.

Optuna and SQLAlchemy find a bad storage URL, an unreachable server, a corrupt `study.db` or a missing
study only when the study is opened, which is after `tune` has created the run directory (and, for
SQLite, an empty `study.db` that then blocks the corrected command with "a study already exists here").
Each of those is a user mistake, so each is found here first and said in one line naming the option:
`--storage` (a URL, its driver, a database that answers), `--out` (a folder this user can write, a study
there or not), `--resume` (a study to continue), `--strategy grid` (a space it can enumerate).
"""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from tuner.errors import UserError
from tuner.inputs import check_out_file
from tuner.limits import MAX_GRID_CONFIGS
from tuner.storage.records import StudyInfo

STUDY_NAME = "slo-tuner"  # tuner.storage.optuna_study.STUDY_NAME (not imported: that imports Optuna)
CONNECT_TIMEOUT_S = 5
SQLITE_MAGIC = b"SQLite format 3\x00"


def _shown(u: Any) -> str:
    return u.render_as_string(hide_password=True)


def check_storage_url(url: str, field: str = "--storage") -> Any:
    """The parsed URL of a storage that can be used: a database URL, of a dialect SQLAlchemy knows,
    whose driver is installed, and (a server database) that answers within `CONNECT_TIMEOUT_S`."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    example = "e.g. sqlite:///runs/x/study.db or postgresql+psycopg2://user@host/db"
    try:
        u = make_url(url)
    except (ArgumentError, ValueError):
        raise UserError(f"not a database URL: {url!r} ({example})", field=field) from None
    try:
        dialect = u.get_dialect()
    except NoSuchModuleError:
        raise UserError(f"unknown database kind {u.drivername!r} ({example})", field=field) from None
    try:
        dialect.import_dbapi()
    except ImportError as e:
        raise UserError(f"{u.drivername}: its Python driver is not installed ({e.name or e}); "
                        "pip install it or use another URL", field=field) from None
    if u.get_backend_name() == "sqlite":
        if not u.database or u.database == ":memory:":
            raise UserError("an in-memory SQLite database keeps nothing: give a file "
                            "(sqlite:///path/study.db)", field=field)
        return u
    _connect(u, field)
    return u


def _connect(u: Any, field: str) -> None:
    """One connection to a server database, closed at once: the study would fail at its first query."""
    from sqlalchemy import create_engine

    args = {"connect_timeout": CONNECT_TIMEOUT_S} if u.get_backend_name() in ("postgresql", "mysql") else {}
    try:
        engine = create_engine(u, connect_args=args, pool_pre_ping=False)
        try:
            with engine.connect():
                pass
        finally:
            engine.dispose()
    except Exception as e:  # noqa: BLE001  (any driver's refusal: OperationalError, a DNS failure, a timeout)
        first = (str(getattr(e, "orig", None) or e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"cannot connect to {_shown(u)}: {first[:200]}", field=field) from None


def sqlite_studies(db: Path, field: str | None = None) -> list[str] | None:
    """The study names stored in the SQLite file `db` (None: no such file); a file that is not an Optuna
    SQLite database, or a damaged one, is a `UserError` naming it."""
    if not db.exists():
        return None
    if db.is_dir():
        raise UserError("is a directory, not a study database", file=db, field=field)
    try:
        with db.open("rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as e:
        raise UserError(f"cannot read: {e.strerror or e}", file=db, field=field) from None
    if head != SQLITE_MAGIC:
        raise UserError("not a study database (not an SQLite file): move it away or give another --out",
                        file=db, field=field)
    try:
        con = sqlite3.connect(f"file:{db.resolve()}?mode=ro", uri=True, timeout=5)
        try:
            if con.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("database disk image is malformed")
            names = [r[0] for r in con.execute("SELECT study_name FROM studies")]
        finally:
            con.close()
    except sqlite3.Error as e:
        raise UserError(f"not a readable study database ({e}): move it away or give another --out", file=db,
                        field=field) from None
    return names


def check_study_target(url: str, out: Path, *, resume: bool, worker: bool = False) -> None:
    """`--out` (and `--storage`) must hold no study unless `--resume`, and one if `--resume` (or for
    `tune worker`, which only ever joins a study)."""
    from sqlalchemy.engine import make_url

    u = check_storage_url(url, "--storage")
    if u.get_backend_name() != "sqlite":
        return  # a server database: the study is looked up when it is opened (no file is created here)
    db = Path(u.database)
    default = (out / "study.db").resolve() == db.resolve()
    option = "--out" if worker else "--resume" if resume else "--out"
    names = sqlite_studies(out / "study.db" if default else db, option)
    if resume and (names is None or STUDY_NAME not in names):
        where = str(out) if default else _shown(make_url(url))
        if worker:
            raise UserError(f"no study in {where} to work on: start one with `tune ... --out {out}`",
                            field=option)
        raise UserError(f"no study to resume in {where}: start it without --resume", field=option)
    if not resume and names and STUDY_NAME in names:
        raise UserError("a study already exists here: pass --resume to continue it, or another --out",
                        field="--out")
    if names is None:
        check_out_file(db, "--out" if default else "--storage")


def check_grid_size(space: Any, strategy: str) -> None:
    """`--strategy grid` queues every configuration before its first launch: a space larger than
    `MAX_GRID_CONFIGS` is refused with its size (the other strategies sample any size)."""
    if strategy != "grid":
        return
    n = space.size()
    if n > MAX_GRID_CONFIGS:
        raise UserError(f"the search space has {n:,} configurations; grid enumerates at most "
                        f"{MAX_GRID_CONFIGS:,} (use --strategy twin, tpe or random, or fewer values)",
                        field="--strategy")


def stored_info(study: Any, run_dir: Path) -> Any:
    """The stored study's `info` (what it was started with), or a `UserError`: a study another tool wrote,
    or one whose record was damaged, is not something `tune worker` can continue."""
    from pydantic import ValidationError

    raw = study.user_attrs.get("info")
    if not isinstance(raw, dict):
        raise UserError("the study has no record of how it was started: not written by `tune`", file=run_dir,
                        field="--out")
    try:
        return StudyInfo(**raw)
    except (ValidationError, TypeError) as e:
        first = (str(e).strip().splitlines() or ["invalid"])[0]
        raise UserError(f"the study's record is damaged ({first})", file=run_dir, field="--out") from None


#: Trials that hold a measurement: finished ones, and failed ones that did not fail by an interruption
#: (a launch that failed is a finding; a trial cut short, or still RUNNING after a crash, is not).
_MEASURED = ("SELECT COUNT(*) FROM trials t WHERE t.state IN ('COMPLETE', 'PRUNED') OR (t.state = 'FAIL' AND "
             "NOT EXISTS (SELECT 1 FROM trial_user_attributes a WHERE a.trial_id = t.trial_id AND "
             "a.key = 'record' AND a.value_json LIKE '%\"interrupted\": true%'))")


def _stored_trials(db: Path) -> int:
    """Measured trials in the SQLite study `db` (0 when there is no readable study: nothing of value)."""
    try:
        con = sqlite3.connect(f"file:{db.resolve()}?mode=ro", uri=True, timeout=5)
        try:
            return int(con.execute(_MEASURED).fetchone()[0])
        finally:
            con.close()
    except (sqlite3.Error, OSError):
        return 0


def _has_study(db: Path) -> bool:
    try:
        return STUDY_NAME in (sqlite_studies(db) or [])
    except UserError:
        return False


@contextmanager
def keep_only_saved(run_dir: Path, *, resume: bool, own_storage: bool, state: dict) -> Iterator[None]:
    """A user mistake found after the run directory was made (a `UserError` before any trial measured
    anything) leaves nothing behind: what this run created in `run_dir` is removed (the folder too, if
    it made it), so the corrected command is not refused with "a study already exists here". An
    interrupt before the study was created removes the same and sets `state["removed"]`, so the caller
    does not claim a study was saved that `--resume` could not find; an interrupted study that exists
    is kept (its cut trial is recorded and re-run on resume). Resumed studies and shared databases are
    never touched; nor is anything after a crash (the server logs are the evidence)."""
    existed = run_dir.is_dir()
    before = {p.name for p in run_dir.iterdir()} if existed else set()
    state["removed"] = False
    try:
        yield
    except (UserError, KeyboardInterrupt) as e:
        db = run_dir / "study.db"
        unsaved = not _has_study(db) if isinstance(e, KeyboardInterrupt) else not _stored_trials(db)
        if not resume and own_storage and unsaved:
            _remove_new(run_dir, existed, before)
            state["removed"] = True
        raise


def _remove_new(run_dir: Path, existed: bool, before: set[str]) -> None:
    import shutil

    if not existed:
        shutil.rmtree(run_dir, ignore_errors=True)
    elif run_dir.is_dir():
        for p in run_dir.iterdir():
            if p.name not in before:
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def check_launcher(engine: str, python: str | None, command: str | None) -> None:
    """`--engine vllm`: what launches the server exists, before a study is created around launches that
    would all fail (`--vllm-python` an interpreter, `--vllm-command`'s program, else `vllm` on PATH)."""
    import os
    import shlex
    import shutil

    if engine != "vllm":
        return
    if python is not None:
        exe = shutil.which(python) or (python if os.path.isfile(python) else None)
        if exe is None or not os.access(exe, os.X_OK):
            raise UserError("no such interpreter (give the python of a venv that has vLLM)", file=python,
                            field="--vllm-python")
    elif command is not None:
        try:
            program = (shlex.split(command) or [""])[0]
        except ValueError as e:
            raise UserError(f"cannot parse the command template: {e}", field="--vllm-command") from None
        if not program or shutil.which(program) is None:
            raise UserError(f"{program or 'nothing'!r} is not a program on PATH", field="--vllm-command")
    elif shutil.which("vllm") is None:
        raise UserError("`vllm` is not on PATH: install vLLM, or give --vllm-python (a venv's interpreter) or "
                        "--vllm-command (a launch template)", field="--engine")
