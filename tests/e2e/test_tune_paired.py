"""The recommendation decided on common request windows (`tuner.search.earn`; `--windows`, on by default
on the in-process simulator).

The README's main job (chat on the simulated RTX 4090): after the search, vLLM's defaults
and the search's best are launched on the same windows; a change is recommended only with a significant
paired gain that clears the floor, and every knob it keeps has a measured, paired share whose interval
excludes zero. The CLI, report.md, tuned-config.yaml and gate.yaml carry the same answer."""

from __future__ import annotations

import json

import optuna
import pytest
import yaml

from tests.e2e.conftest import sqlite_url, tune
from tests.e2e.test_report_cli import tuned_run
from tuner.capacity.paired import paired_ratio
from tuner.recommend import Recommendation, changed_knobs
from tuner.storage.earned import EarnedLog

pytestmark = [pytest.mark.e2e]


@pytest.fixture(scope="module")
def paired_run(tmp_path_factory):
    """The README's main job (the session's cached run, `tests/e2e/test_report_cli.py`): the in-process
    simulator runs the paired check by default."""
    out = tuned_run(tmp_path_factory, 4)
    return out, out.with_suffix(".stdout").read_text()


def test_the_answer_rests_on_paired_windows_and_every_kept_knob_earned_its_place(paired_run):
    out, said = paired_run
    rep = json.loads((out / "report.json").read_text())
    r = Recommendation.model_validate(rep["recommendation"])
    assert r.paired and "paired t-test" in r.test
    study = optuna.load_study(study_name=None, storage=sqlite_url(out))
    log = EarnedLog.read(study.user_attrs)
    assert log is not None and len(log.window_seeds) == 12 and log.defaults_trials
    records = {t.number: t.user_attrs["record"] for t in study.trials if "record" in t.user_attrs}
    for n in log.defaults_trials + log.best_trials + log.final_trials:
        assert records[n]["role"] == "paired" and records[n]["windows"]
    for s in r.shares:  # a knob in the recommendation: its measured share's interval excludes zero
        if s.kept:
            assert s.low_pct is not None and s.low_pct > 0 and s.knob in r.knobs
        else:
            assert s.knob not in r.knobs
    assert set(changed_knobs(r.knobs, None)) <= {s.knob for s in r.shares if s.kept}
    if r.kind == "tuned":
        assert r.gain_low_pct > 0 and r.gain_pct >= 100 * r.floor
    else:
        assert r.knobs == {} and r.trial in log.defaults_trials
    line = r.line()
    assert line in said and line[0].upper() + line[1:] in (out / "report.md").read_text()
    gate = yaml.safe_load((out / "gate.yaml").read_text())
    assert gate["knobs"] == r.knobs and gate["source_trial"] == r.trial
    md = (out / "report.md").read_text()
    assert "Decided on common request windows" in md


def test_the_stored_shares_are_recomputed_from_the_windows(paired_run):
    """The report's shares are the windows' paired ratios, not copies: recomputed here from the records."""
    out, _ = paired_run
    study = optuna.load_study(study_name=None, storage=sqlite_url(out))
    log = EarnedLog.read(study.user_attrs)
    recs = {t.number: t.user_attrs["record"] for t in study.trials if "record" in t.user_attrs}
    rep = Recommendation.model_validate(json.loads((out / "report.json").read_text())["recommendation"])
    from tuner.storage.records import WindowCapacity

    def wins(ns):
        return [WindowCapacity(**w) for n in ns for w in recs[n]["windows"]]

    for step, share in zip(log.steps, rep.shares):
        est = paired_ratio(wins(step.with_trials), wins(step.without_trials))
        assert share.share_pct == pytest.approx(100 * est.value)


def test_ctrl_c_in_the_paired_check_resumes_to_the_same_answer_without_repeating_a_finished_launch(
        tmp_path, spawn):
    """Ctrl-C while the search's best is being measured on the common windows, then `--resume`: the
    paired launch of the defaults is read back (not launched again), the cut one is run again on the
    windows it had not finished (those it had are carried, not measured again), and the answer is the
    uninterrupted study's."""
    from optuna.trial import TrialState

    from tests.e2e.conftest import load_trials, study_args, wait_for

    whole = tmp_path / "whole"
    p = tune(*study_args(whole, "sim", "--windows", "12"))
    assert p.returncode == 0, p.stderr
    out = tmp_path / "cut"
    args = study_args(out, "sim", "--windows", "12")
    run = spawn(args, tmp_path / "tune.log")

    def in_second_paired_trial():
        said = run.output()
        if run.poll() is not None:
            raise AssertionError(f"tune ended before the cut:\n{said}")
        heads = [i for i in range(len(said)) if said.startswith("(paired)", i)]
        if len(heads) < 2:
            return False
        rest = said[heads[1]:]
        # past its first window: a window's knee search is a few load runs (bisection closes it in 3-4)
        return rest.count(" req/s  pass") + rest.count(" req/s  fail") >= 5

    wait_for(in_second_paired_trial, 120, 0.05, "the second paired trial past its first window")
    run.ctrl_c()
    assert run.wait(timeout=60) == 130, run.output()
    resumed = tune(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    trials = load_trials(sqlite_url(out))
    paired = [t for t in trials if t.user_attrs.get("record", {}).get("role") == "paired"]
    done = [t for t in paired if t.state == TrialState.COMPLETE]
    cut = [t for t in paired if t.user_attrs["record"].get("interrupted")]
    assert len(cut) == 1 and len(done) == 2, [(t.number, t.state) for t in paired]
    assert len({json.dumps(t.user_attrs["record"]["knobs"], sort_keys=True) for t in done}) == 2
    kept = cut[0].user_attrs["record"]["windows"]
    again = next(t.user_attrs["record"] for t in done if t.user_attrs["record"]["knobs"] ==
                 cut[0].user_attrs["record"]["knobs"])
    assert kept and again["windows_from"] == [cut[0].number], (len(kept), again.get("windows_from"))
    assert again["windows"][:len(kept)] == kept  # carried, in the plan's order, then the rest measured
    a = Recommendation.model_validate(json.loads((whole / "report.json").read_text())["recommendation"])
    b = Recommendation.model_validate(json.loads((out / "report.json").read_text())["recommendation"])
    assert (a.kind, a.knobs, a.capacity_rps, a.gain_pct) == (b.kind, b.knobs, b.capacity_rps, b.gain_pct)
