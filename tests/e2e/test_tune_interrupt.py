"""`tune --engine sim-http` killed mid-trial, then resumed: real subprocess servers, real HTTP load.

Ctrl-C must leave nothing behind (server, watchdog, port) and say how to resume; SIGKILL must not leave a
server either (pdeathsig and the watchdog take it down; `--resume` reaps what a pidfile still names); and
`--resume` must finish the study with the interrupted configuration re-run, not lost.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from optuna.trial import TrialState

from tests.e2e.conftest import (TUNE_FIX, group_members, knobs_of, load_trials, port_is_free, processes_mentioning,
                                record, server_gone, server_pidfiles, session_members, sqlite_states,
                                sqlite_url, study_args, tune, wait_for)

pytestmark = pytest.mark.e2e

DONE = (TrialState.COMPLETE, TrialState.PRUNED)


def wait_mid_trial(p, out: Path, min_number: int = 0, timeout: float = 120,
                   reported: bool = True) -> tuple[int, dict]:
    """Block until trial >= `min_number` is RUNNING with its server up and serving load; return the
    trial's number and the server's pidfile record. `reported`: a load run of the trial has already
    ended (its line on stderr), so the cut falls after a finished run; otherwise the cut may fall in the
    trial's first run, as soon as the server's own /metrics shows requests running (a load run less)."""
    def running():
        if p.poll() is not None:
            raise AssertionError(f"tune exited early ({p.poll()}):\n{p.output()}")
        states = [n for n, s in sqlite_states(out / "study.db") if s == "RUNNING" and n >= min_number]
        recs = [r for r in server_pidfiles(out) if not port_is_free(r["port"])]
        if not (states and len(recs) == 1):
            return None
        if not reported:
            return (states[-1], recs[0]) if requests_running(recs[0]["port"]) else None
        # the knee search under way: a load run of this trial already reported on stderr
        said = p.output()
        head = said.rfind(f"trial {states[-1]} (")
        return (states[-1], recs[0]) if head >= 0 and " req/s " in said[head:] else None
    return wait_for(running, timeout, 0.2, f"trial >= {min_number} running with its server under load")


def requests_running(port: int) -> bool:
    """Whether the server on `port` says, on its own /metrics, that it is serving requests now."""
    import httpx

    from tuner.metrics.parse import RUNNING
    from tuner.metrics.scrape import scrape

    try:
        return scrape(f"http://127.0.0.1:{port}", timeout_s=2, only=(RUNNING,)).gauge(RUNNING) > 0
    except httpx.HTTPError:
        return False


def assert_study_complete(out: Path, resumed) -> list:
    assert resumed.returncode == 0, resumed.stderr
    assert "stopped:" in resumed.stdout
    trials = load_trials(sqlite_url(out))
    done = [t for t in trials if t.state in DONE]
    assert len({knobs_of(t) for t in done}) == len(done), "a configuration was measured twice"
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)], \
        [(t.number, t.state) for t in trials]
    assert server_pidfiles(out) == [], "a server pidfile outlived the study"
    return trials


# ~80 s, the slow tier: the default run keeps the signal tests' Ctrl-C at each kind of point, the resume
# tests and the PostgreSQL worker's Ctrl-C hand-back
@pytest.mark.slow
def test_ctrl_c_mid_trial_stops_everything_and_resume_reruns_the_trial(tmp_path: Path, spawn) -> None:
    out = tmp_path / "run"
    p = spawn(study_args(out, "sim-http"), tmp_path / "tune.log")
    number, srv = wait_mid_trial(p, out)
    assert group_members(srv["pgid"]), "the server should be running"

    p.ctrl_c()
    assert p.wait(timeout=60) == 130, p.output()
    said = p.output()
    assert "Traceback" not in said, said
    hint = [line for line in said.splitlines() if line.startswith("interrupted: ")]
    assert len(hint) == 1 and "continue with: tune " in hint[0], said
    resume = shlex.split(hint[0].split("continue with: ", 1)[1])[1:]
    assert "--resume" in resume and resume[:-1] == [str(a) for a in study_args(out, "sim-http")], resume
    # nothing of the tool's session is left, nor the server (its own session), its watchdog or its port
    assert session_members(p.pid) == []
    assert server_gone(srv), srv
    assert server_pidfiles(out) == []

    trials = {t.number: t for t in load_trials(sqlite_url(out))}
    cut = trials[number]
    assert cut.state == TrialState.FAIL and record(cut)["interrupted"] is True, (cut.state, record(cut))
    assert record(cut)["launched"] is True

    resumed = tune(*resume, timeout=240)  # exactly the command the tool said to run
    after = assert_study_complete(out, resumed)
    again = [t for t in after if t.number > number and knobs_of(t) == knobs_of(cut)]
    assert [t.state in DONE for t in again] == [True], "the interrupted configuration must be re-run once"
    assert record(again[0])["interrupted"] is False and record(again[0])["load_runs"]
    # the interrupted trial is still there, marked, and the budget (3 launches) counts only real trials
    assert [t.number for t in after if record(t).get("interrupted")] == [number]
    assert len([t for t in after if t.state in DONE or record(t).get("launch_failure_kind")]) <= 3


def _orphan_server(servers: Path) -> dict:
    """A server group that a killed tool *and* its killed watchdog left behind, with its pidfile in the
    run directory: only `--resume` (reap_stale) can stop it."""
    d = servers / "launch-999-orphan"
    d.mkdir(parents=True)
    tool = subprocess.Popen([sys.executable, "-m", "tuner.testing.standin_tool", str(d), "--children", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        srv = json.loads(tool.stdout.readline())
        watchdog = wait_for(lambda: _watchdog_of(srv["pgid"]), 10, what="the orphan's watchdog")
        os.kill(watchdog, signal.SIGKILL)
        tool.kill()
        tool.wait()
        # pdeathsig takes the direct child; its two children stay, as vLLM's engine core and workers do
        wait_for(lambda: len(group_members(srv["pgid"])) == 2, 10, what="the orphan's children alone")
    finally:
        if tool.poll() is None:
            tool.kill()
            tool.wait()
    return srv


def _watchdog_of(pgid: int) -> int | None:
    found = processes_mentioning("tuner.engine.watchdog", str(pgid))
    return found[0] if found else None


# ~2.5 min, the slow tier (the default run keeps test_tune_twin's SIGKILL mid-verification and resume, and
# the Ctrl-C mid-trial and resume below); test_tune_resume's, with confirmations, ~4 min, is slow too
@pytest.mark.slow
def test_sigkill_mid_trial_leaves_no_server_and_resume_finishes_the_grid(tmp_path: Path, spawn) -> None:
    out = tmp_path / "run"
    args = study_args(out, "sim-http", "--strategy", "grid")
    p = spawn(args, tmp_path / "tune.log")
    number, srv = wait_mid_trial(p, out, min_number=1)  # a grid trial, popped from the trial queue
    p.kill()
    assert p.poll() == -signal.SIGKILL
    # pdeathsig kills the server at once; the watchdog sees the tool's pipe close and stops the rest
    wait_for(lambda: server_gone(srv), 20, what=f"the server of the killed tool to go: {srv}")
    assert session_members(p.pid) == []
    assert [s for n, s in sqlite_states(out / "study.db") if n == number] == ["RUNNING"]

    orphan = _orphan_server(out / "servers")
    assert group_members(orphan["pgid"])

    resumed = tune(*args, "--resume", timeout=240)
    assert group_members(orphan["pgid"]) == [] and port_is_free(orphan["port"]), "--resume must reap it"
    after = assert_study_complete(out, resumed)
    killed = next(t for t in after if t.number == number)
    assert killed.state == TrialState.FAIL and record(killed)["interrupted"] is True, (killed.state,
                                                                                       record(killed))
    done = [t for t in after if t.state in DONE]
    # the whole grid (baseline + 2 configurations) measured exactly once, the killed one included
    assert sorted(knobs_of(t) for t in done) == sorted(['{}', '{"max_num_seqs": 128}', '{"max_num_seqs": 32}'])
    assert any(knobs_of(t) == knobs_of(killed) and t.number > number for t in done)


def test_ctrl_c_while_the_server_starts_is_recorded_as_interrupted(tmp_path: Path, spawn) -> None:
    """Real vLLM takes minutes to come up; Ctrl-C then must stop it and record the trial as interrupted
    (not leave it RUNNING). A stand-in server that never gets healthy plays vLLM."""
    out = tmp_path / "run"
    template = f"{sys.executable} -m tuner.testing.standin_server --port {{port}} --startup-delay 300 {{args}}"
    args = study_args(out, "vllm", "--model", "standin", "--vllm-command", template)
    p = spawn(args, tmp_path / "tune.log")

    def starting():
        if p.poll() is not None:
            raise AssertionError(f"tune exited early ({p.poll()}):\n{p.output()}")
        recs = server_pidfiles(out)
        running = [n for n, s in sqlite_states(out / "study.db") if s == "RUNNING"]
        return recs[0] if recs and running and not port_is_free(recs[0]["port"]) else None
    srv = wait_for(starting, 60, 0.1, "the stand-in server to be starting")
    p.ctrl_c()
    assert p.wait(timeout=60) == 130, p.output()
    assert "Traceback" not in p.output()
    assert server_gone(srv) and session_members(p.pid) == []
    (trial,) = load_trials(sqlite_url(out))
    assert trial.state == TrialState.FAIL, trial.state
    assert record(trial)["interrupted"] is True and record(trial)["launched"] is False, record(trial)


def test_resume_keeps_the_studys_trial_budget(tmp_path: Path) -> None:
    """--max-trials counts the study's launches, not the resumed process's: resuming a study that spent
    its budget launches nothing more; a larger --max-trials extends it."""
    out = tmp_path / "run"
    def args(n: int) -> list[str]:
        return study_args(out, "sim", "--requests-per-run", "300", max_trials=n,
                          space=TUNE_FIX / "space_budget.yaml")

    def launched() -> list:
        return [t for t in load_trials(sqlite_url(out)) if record(t).get("launched")]

    first = tune(*args(2))
    assert first.returncode == 0, first.stderr
    assert len(launched()) == 2
    again = tune(*args(2), "--resume")
    assert again.returncode == 0, again.stderr
    assert len(launched()) == 2 and "stopped: budget spent" in again.stdout
    more = tune(*args(3), "--resume")
    assert more.returncode == 0, more.stderr
    assert len(launched()) == 3
