"""Helpers for running `tune` as a user does: a real process, its exit code, its stderr, and its storage.

Everything here reads the outside of the tool only: the exit code and stderr, the Optuna storage it wrote
(SQLite in the run directory, or PostgreSQL), its server pidfiles, and /proc for what processes are left.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import pytest

from tests.conftest import FIXTURES

_TUNE = Path(sys.executable).parent / "tune"
TUNE = [str(_TUNE)] if _TUNE.exists() else [sys.executable, "-m", "tuner.cli"]
TUNE_FIX = FIXTURES / "tune"
WORKLOAD = TUNE_FIX / "tiny.jsonl"
SLO = TUNE_FIX / "tiny.slo.yaml"
SPACE2 = TUNE_FIX / "space2.yaml"
GPU, MODEL = "rtx4090", "qwen2.5-7b"

# A short sim-http study: load runs of at most 8 s, a coarse knee search (precision 0.5: a few runs a
# trial), and an SLO whose TPOT bound puts the knee low (~23 req/s), where the HTTP simulator keeps up with
# its simulated GPU on a busy CPU. The baseline starts at 32 req/s, over that knee (it fails: 32, 16, 22.6
# in three runs): a start at 64 overloaded the server and waited seconds for its queue to drain, one run
# more (a baseline-only study: 37.6 s at 64, 28.0 s at 32, on 2 cores on 2026-12-05).
SIM_HTTP_LOAD = ["--requests-per-run", "400", "--max-run-s", "8", "--precision", "0.5", "--start-rate", "32"]


def tune_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb", "PYTHONUNBUFFERED": "1",
            **extra}


def tune(*args: str | Path, timeout: float = 400, cwd: Path | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `tune ARGS` to the end (its own session, so nothing it leaves can reach pytest's group)."""
    return subprocess.run([*TUNE, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=env or tune_env(), start_new_session=True)


def study_args(out: Path, engine: str = "sim-http", *extra: str | Path, space: Path = SPACE2,
               max_trials: int = 3, strategy: str = "guided") -> list[str]:
    """The tiny study every end-to-end test runs, on `engine`."""
    # --strategy guided, --no-confirm, --windows 0 (no paired check after the search): these tests count
    # launches of a fixed plan (the default, the twin,
    # has its own in test_tune_twin.py; the confirmation launches theirs in tests/unit/test_strategy.py)
    args = ["--workload", WORKLOAD, "--slo", SLO, "--engine", engine, "--search-space", space,
            "--max-trials", str(max_trials), "--strategy", strategy, "--no-confirm", "--windows", "0", "--out", out]
    if engine in ("sim", "sim-http"):
        args += ["--gpu", GPU, "--model", MODEL]
    if engine != "sim":
        args += SIM_HTTP_LOAD
    return [str(a) for a in [*args, *extra]]


class TuneProcess:
    """`tune` started in its own session (as a shell starts a foreground job), stderr to a file."""

    def __init__(self, args: Sequence[str | Path], log: Path, env: dict[str, str] | None = None,
                 argv0: Sequence[str] = TUNE):
        self.log = log
        self._f = open(log, "w")
        self.popen = subprocess.Popen([*argv0, *map(str, args)], stdout=self._f, stderr=subprocess.STDOUT,
                                      text=True, env=env or tune_env(), start_new_session=True)
        self.pid = self.popen.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        finally:
            self._f.flush()

    def ctrl_c(self) -> None:
        """What Ctrl-C in a terminal does: SIGINT to the foreground process group."""
        os.killpg(self.pid, signal.SIGINT)

    def kill(self) -> None:
        self.popen.kill()
        self.popen.wait()

    def close(self) -> None:
        """Never leave a tool running after a test, whatever happened."""
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        self._f.close()


@pytest.fixture
def spawn():
    """Start `tune` processes that are killed (SIGKILL) at the end of the test if still running."""
    started: list[TuneProcess] = []

    def _spawn(args: Sequence[str | Path], log: Path, **kw) -> TuneProcess:
        p = TuneProcess(args, log, **kw)
        started.append(p)
        return p

    yield _spawn
    for p in started:
        p.close()


def wait_for(pred: Callable[[], object], timeout: float, interval: float = 0.1, what: str = "") -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what or pred}")
        time.sleep(interval)


# -- storage --------------------------------------------------------------------------------------------
def sqlite_states(db: Path) -> list[tuple[int, str]]:
    """(number, state) of every trial, read straight from the SQLite file without locking it for long
    (the tool is writing it); [] while the schema does not exist yet."""
    if not db.exists():
        return []
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return list(con.execute("SELECT number, state FROM trials ORDER BY number"))
        finally:
            con.close()
    except sqlite3.Error:
        return []


def load_trials(url: str):
    """Every trial of the tool's study in storage `url`, as Optuna FrozenTrials."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name="slo-tuner", storage=url).get_trials(deepcopy=False)


def sqlite_url(out: Path) -> str:
    return f"sqlite:///{(out / 'study.db').resolve()}"


def record(t) -> dict:
    return t.user_attrs.get("record") or {}


def knobs_of(t) -> str:
    """A trial's configuration, comparable across trials (unset knobs dropped)."""
    return json.dumps({k: v for k, v in t.params.items() if v is not None}, sort_keys=True)


# -- processes ------------------------------------------------------------------------------------------
def _stat(pid: int) -> list[str] | None:
    try:
        data = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return None
    return data[data.rfind(")") + 2:].split()


def live_pids() -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st and st[0] not in ("Z", "X"):
                out.append(int(name))
    return out


def session_members(sid: int) -> list[int]:
    """Live processes of session `sid` (field 6 of /proc/PID/stat)."""
    return [p for p in live_pids() if (st := _stat(p)) and int(st[3]) == sid]


def group_members(pgid: int) -> list[int]:
    return [p for p in live_pids() if (st := _stat(p)) and int(st[2]) == pgid]


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def processes_mentioning(*words: str) -> list[int]:
    """Live processes whose command line contains every one of `words` (e.g. a server's port)."""
    return [p for p in live_pids() if p != os.getpid() and all(w in cmdline(p) for w in words)]


def server_pidfiles(out: Path) -> list[dict]:
    """The launcher's pidfile records under `out` (one per server currently launched)."""
    recs = []
    for f in sorted(out.rglob("server.pid")):
        try:
            recs.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            pass
    return recs


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    from tuner.engine.launcher import port_is_free as free

    return free(host, port)


def server_gone(rec: dict) -> bool:
    """Nothing of the server launched with pidfile record `rec` is left: group, watchdog, port."""
    return (not group_members(rec["pgid"])
            and not processes_mentioning("tuner.engine.watchdog", str(rec["pgid"]))
            and not processes_mentioning("tuner.cli.serve_sim", str(rec["port"]))
            and port_is_free(rec["port"]))

