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

from tests.e2e.conftest import sqlite_url
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
