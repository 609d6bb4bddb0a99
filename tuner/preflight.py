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
from pathlib import Path
from typing import Any

from tuner.errors import UserError
from tuner.limits import MAX_GRID_CONFIGS

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


def check_study_target(url: str, out: Path, *, resume: bool) -> None:
    """`--out` (and `--storage`) must hold no study unless `--resume`, and one if `--resume`."""
    from sqlalchemy.engine import make_url

    u = check_storage_url(url, "--storage")
    if u.get_backend_name() != "sqlite":
        return  # a server database: the study is looked up when it is opened (no file is created here)
    db = Path(u.database)
    names = sqlite_studies(db, "--resume" if resume else "--out")
    default = (out / "study.db").resolve() == db.resolve()
    if resume and (names is None or STUDY_NAME not in names):
        where = str(out) if default else _shown(make_url(url))
        raise UserError(f"no study to resume in {where}: start it without --resume", field="--resume")
    if not resume and names and STUDY_NAME in names:
        raise UserError("a study already exists here: pass --resume to continue it, or another --out",
                        field="--out")
    if names is None:
        from tuner.inputs import check_out_file

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
