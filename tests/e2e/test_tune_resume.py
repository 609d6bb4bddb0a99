"""`--resume` after a SIGKILL reuses every finished launch, the baseline's confirmation included, and the
budget counts launches as stored (issue 12, item 2).

A guided study with confirmation launches (the baseline launched twice, on a noisy HTTP simulator) is
SIGKILLed while a later trial is under load, then resumed: the resumed process reads each stored launch
back where the first one made it, re-runs only the trial the kill cut, and stops with exactly
`--max-trials` launches in the storage, no configuration launched twice in the same role.
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest
from optuna.trial import TrialState

from tests.e2e.conftest import (TUNE_FIX, knobs_of, load_trials, record, server_gone, server_pidfiles,
                                session_members, sqlite_url, study_args, tune, wait_for)
from tests.e2e.test_tune_interrupt import wait_mid_trial

pytestmark = pytest.mark.e2e

BUDGET = 5


def confirming_study(out: Path) -> list[str]:
    """The e2e study with confirmation launches on (study_args turns them off) and launch noise."""
    args = [a for a in study_args(out, "sim-http", "--noise", "0.05", space=TUNE_FIX / "space-wide.yaml",
                                  max_trials=BUDGET) if a != "--no-confirm"]
    return args


def launched(trials) -> list:
    """Trials that spent a launch and finished (an interrupted one is re-run, not counted)."""
    return [t for t in trials if not record(t).get("interrupted") and t.state != TrialState.RUNNING
            and (record(t).get("launched") or record(t).get("launch_failure_kind") not in (None, "bad_flag"))]


@pytest.mark.slow  # ~4 min on 2 cores; the default run SIGKILLs and resumes a grid (test_tune_interrupt)
def test_resume_after_sigkill_reuses_every_finished_launch_and_spends_the_budget_exactly(
        tmp_path: Path, spawn) -> None:
    out = tmp_path / "run"
    args = confirming_study(out)
    p = spawn(args, tmp_path / "tune.log")
    # trial 0 is the baseline, trial 1 its confirmation: kill a later one, mid-load
    number, srv = wait_mid_trial(p, out, min_number=2, timeout=240)
    p.kill()
    assert p.poll() == -signal.SIGKILL
    wait_for(lambda: server_gone(srv), 20, what=f"the killed tool's server to go: {srv}")
    assert session_members(p.pid) == []

    before = {t.number: t for t in load_trials(sqlite_url(out))}
    done_before = launched(before.values())
    assert [record(t)["role"] for t in done_before][:2] == ["baseline", "confirm"], \
        [(t.number, record(t).get("role")) for t in done_before]
    assert before[number].state == TrialState.RUNNING

    resumed = tune(*args, "--resume", timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert "Traceback" not in resumed.stderr
    after = load_trials(sqlite_url(out))
    assert not [t for t in after if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert server_pidfiles(out) == []

    done = launched(after)
    # the budget counts launches as stored: exactly --max-trials of them, the interrupted one not counted
    assert len(done) == BUDGET, [(t.number, record(t).get("role"), knobs_of(t)) for t in done]
    # every launch finished before the kill is still there, unchanged, and none was launched again
    for t in done_before:
        assert next(a for a in after if a.number == t.number).state == t.state
    roles = Counter((record(t)["role"], knobs_of(t)) for t in done)
    assert all(n == 1 for n in roles.values()), f"a launch was repeated: {roles}"
    # the trial the kill cut is marked, and its configuration (in its role) re-run exactly once
    killed = next(t for t in after if t.number == number)
    assert killed.state == TrialState.FAIL and record(killed)["interrupted"] is True
    again = [t for t in done if t.number > number and knobs_of(t) == knobs_of(killed)
             and record(t)["role"] == record(killed)["role"]]
    assert len(again) == 1, [(t.number, record(t)["role"], knobs_of(t)) for t in done]
    # the resumed process launched only what the first had not finished
    new = [t for t in done if t.number > max(before)]
    assert len(new) == BUDGET - len(done_before)


def test_resume_with_confirmation_launches_counts_each_launch(tmp_path: Path) -> None:
    """The baseline and its confirmation are two launches of one configuration: a finished study resumed
    with the same --max-trials launches nothing (counting by configuration made it launch more), and a
    larger one extends it without launching any stored launch again."""
    out = tmp_path / "run"

    def args(n: int) -> list[str]:
        return [a for a in study_args(out, "sim", "--requests-per-run", "300", "--noise", "0.05",
                                      space=TUNE_FIX / "space-wide.yaml", max_trials=n) if a != "--no-confirm"]

    first = tune(*args(4))
    assert first.returncode == 0, first.stderr
    trials = load_trials(sqlite_url(out))
    assert len(launched(trials)) == 4
    assert [record(t)["role"] for t in trials[:2]] == ["baseline", "confirm"]
    again = tune(*args(4), "--resume")
    assert again.returncode == 0, again.stderr
    assert len(launched(load_trials(sqlite_url(out)))) == 4, "a resumed study that spent its budget launched"
    more = tune(*args(6), "--resume")
    assert more.returncode == 0, more.stderr
    done = launched(load_trials(sqlite_url(out)))
    assert len(done) == 6
    roles = Counter((record(t)["role"], knobs_of(t)) for t in done)
    assert all(n == 1 for n in roles.values()), f"a launch was repeated: {roles}"
