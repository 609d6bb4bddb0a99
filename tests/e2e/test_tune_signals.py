"""Ctrl-C and SIGTERM stop a study wherever they land: exit 130 within seconds, nothing left running, the
cut trial marked interrupted in the storage (issue 12, item 1).

Real `tune` processes on the HTTP simulator (`tests.helpers.interrupt_study` runs the tool unchanged and
sends itself the signal at one precise point: a server starting, the last request of a load run in
flight, the instant a load run is built as finished, a trial just created, a record being written), and a
stand-in server that ignores SIGTERM while it "loads", as vLLM does.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import pytest
from optuna.trial import TrialState

from tests.e2e.conftest import (live_pids, load_trials, port_is_free, record, server_pidfiles, sqlite_states,
                                sqlite_url, study_args, tune_env, wait_for)

pytestmark = pytest.mark.e2e

HARNESS = [sys.executable, "-m", "tests.helpers.interrupt_study"]
#: "Within a few seconds", with room for a busy two-core machine: the tool's own bound is a 3 s SIGTERM
#: grace (`launcher.INTERRUPT_TERM_S`), then SIGKILL.
EXIT_WITHIN_S = 20.0


def marked_processes(mark: str) -> list[int]:
    """Live processes that inherited the test's environment marker (the tool, its servers, watchdogs)."""
    needle = f"TUNE_TEST_MARK={mark}".encode()
    out = []
    for pid in live_pids():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            out.append(pid)
    return out


def run_until_exit(p, timeout: float) -> float:
    """Wait for the tool to exit; the CLOCK_MONOTONIC time it was seen gone (shared by all processes)."""
    deadline = time.monotonic() + timeout
    while p.poll() is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"tune still running after {timeout:.0f} s:\n{p.output()[-3000:]}")
        time.sleep(0.05)
    return time.monotonic()


def signal_sent_at(said: str) -> float:
    line = next((ln for ln in said.splitlines() if ln.startswith("SIGNAL SENT ")), None)
    assert line is not None, f"the study ended before reaching the point:\n{said[-3000:]}"
    return float(line.split()[2])


def _later(point: str):
    """A point the default run already covers earlier in the study (each ~40 s on 2 cores, as long as the
    study takes to reach it): in the slow tier, so the default run stays well under 30 minutes."""
    return pytest.param(point, marks=pytest.mark.slow)


POINTS = [
    "startup:1",        # the baseline's server coming up
    _later("startup:2"),  # a candidate's server coming up (startup:1 covers the kind)
    "last-request:1",   # the first load run's last request in flight
    _later("last-request:4"),
    "run-end:1",        # a load run built as finished, not yet returned: where a Ctrl-C was swallowed
    _later("run-end:2"),  # run-end:1 covers the kind
    _later("run-end:5"),
    "run-end:3:TERM",   # SIGTERM (a CI timeout, `kill`) at the same instant
    "ask:1",            # a trial just created in the storage
    _later("ask:2"),
    "tell:1",           # the baseline's record being written
]


@pytest.mark.parametrize("point", POINTS)
def test_a_signal_anywhere_stops_the_study_within_seconds(point: str, tmp_path: Path, spawn) -> None:
    out = tmp_path / "run"
    mark = uuid.uuid4().hex
    env = tune_env(TUNER_TEST_SIGNAL=point, TUNE_TEST_MARK=mark)
    p = spawn(study_args(out, "sim-http"), tmp_path / "tune.log", env=env, argv0=HARNESS)
    gone_at = run_until_exit(p, 240)
    said = p.output()
    sent = signal_sent_at(said)
    assert p.poll() == 130, said[-3000:]
    assert gone_at - sent < EXIT_WITHIN_S, f"exited {gone_at - sent:.1f} s after the signal"
    assert "Traceback" not in said, said[-3000:]
    assert [ln for ln in said.splitlines() if ln.startswith("interrupted: the study is saved")], said[-2000:]

    # nothing of the tool is left: no server, no watchdog, no pidfile, no bound port
    wait_for(lambda: not marked_processes(mark), 10, what="every process of the tool to be gone")
    assert server_pidfiles(out) == []

    # the storage: nothing left RUNNING; the trial the signal cut (if it cut one) is marked interrupted,
    # and it is the last one (the study stopped there)
    trials = load_trials(sqlite_url(out))
    assert not [t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)], \
        [(t.number, t.state) for t in trials]
    cut = [t for t in trials if record(t).get("interrupted")]
    if point.startswith("tell"):
        # the signal waits for the record and the trial's state to be written together: nothing is cut
        assert cut == [] and trials and all(t.state != TrialState.FAIL for t in trials), \
            [(t.number, t.state, record(t)) for t in trials]
    else:
        assert [t.number for t in cut] == [max(t.number for t in trials)], \
            [(t.number, t.state, record(t).get("interrupted")) for t in trials]
        assert cut[0].state == TrialState.FAIL
        if point.startswith(("startup", "ask")):
            assert record(cut[0])["launched"] is False, record(cut[0])
        else:
            assert record(cut[0])["launched"] is True, record(cut[0])


def test_a_server_ignoring_sigterm_at_startup_is_killed_within_seconds(tmp_path: Path, spawn) -> None:
    """vLLM ignores SIGTERM while it loads weights and compiles: after a Ctrl-C the tool gives the group
    a short grace, then SIGKILLs it, instead of waiting out a long stop timeout."""
    out = tmp_path / "run"
    mark = uuid.uuid4().hex
    template = (f"{sys.executable} -m tuner.testing.standin_server --port {{port}} --startup-delay 300 "
                f"--ignore-term {{args}}")
    args = study_args(out, "vllm", "--model", "standin", "--vllm-command", template)
    p = spawn(args, tmp_path / "tune.log", env=tune_env(TUNE_TEST_MARK=mark))

    def starting():
        if p.poll() is not None:
            raise AssertionError(f"tune exited early ({p.poll()}):\n{p.output()}")
        recs = server_pidfiles(out)
        running = [n for n, s in sqlite_states(out / "study.db") if s == "RUNNING"]
        return recs[0] if recs and running and not port_is_free(recs[0]["port"]) else None
    srv = wait_for(starting, 60, 0.1, "the stand-in server to be starting")
    sent = time.monotonic()
    p.ctrl_c()
    gone_at = run_until_exit(p, 60)
    assert p.poll() == 130, p.output()
    # 3 s of grace, then SIGKILL; the old 10 s grace alone would not fit
    assert gone_at - sent < 9.0, f"exited {gone_at - sent:.1f} s after Ctrl-C"
    wait_for(lambda: not marked_processes(mark), 10, what="the server group to be gone")
    assert port_is_free(srv["port"])
    (trial,) = load_trials(sqlite_url(out))
    assert trial.state == TrialState.FAIL and record(trial)["interrupted"] is True, record(trial)
