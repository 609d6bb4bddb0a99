"""A scenario with a significant gain: strict-TPOT chat (p99 TPOT <= 25 ms) on the simulated RTX 4090.

The twin jumps several knobs at once; the study predicts each knob's share with the fitted twin (one knob
left out at a time), drops the knobs within noise and launches the simpler configuration to confirm it.
The recommendation is then a measured configuration with a gain above the noise floor, the knob-by-knob
table has one knob a row with its share labelled predicted (or measured) beside the step's measured total,
and the CLI, report.md's headline, tuned-config.yaml and gate.yaml name the same configuration."""

from __future__ import annotations

import json
import re

import optuna
import pytest
import yaml

from tests.conftest import ROOT
from tests.e2e.conftest import GPU, MODEL, TUNE_FIX, sqlite_url, tune
from tuner.recommend import Recommendation, changed_knobs, output_changing

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # a twin study of ~2.5 min: the slow tier


@pytest.fixture(scope="module")
def strict(tmp_path_factory):
    out = tmp_path_factory.mktemp("strict") / "run"
    p = tune("--workload", ROOT / "workloads" / "chat.jsonl", "--slo", ROOT / "workloads" / "chat-strict.slo.yaml",
             "--engine", "sim", "--gpu", GPU, "--model", MODEL, "--search-space", TUNE_FIX / "space-strict.yaml",
             "--strategy", "twin", "--max-trials", "4", "--requests-per-run", "300", "--out", out, timeout=1200)
    assert p.returncode == 0, p.stderr
    return out, p.stdout


def test_a_significant_gain_is_recommended_and_all_four_agree(strict):
    out, said = strict
    rep = json.loads((out / "report.json").read_text())
    r = Recommendation.model_validate(rep["recommendation"])
    assert r.kind == "tuned" and r.gain_pct > 100 * r.floor, r
    assert r.line() in said and r.line()[0].upper() + r.line()[1:] in (out / "report.md").read_text()
    gate = yaml.safe_load((out / "gate.yaml").read_text())
    cfg = yaml.safe_load((out / "tuned-config.yaml").read_text()) or {}
    assert gate["knobs"] == r.knobs == rep["tuned"]["knobs"] and gate["source_trial"] == r.trial
    assert {k.replace("-", "_"): v for k, v in cfg.items()} == r.knobs
    # an output-changing knob only with a gain of its own above the floor
    if output_changing(r.knobs, None):
        neutral = [t["capacity_rps"] for t in rep["trials"] if t["capacity_rps"] and t["state"] == "COMPLETE"
                   and not output_changing(t["knobs"], None)]
        assert r.capacity_rps > max(neutral) * (1 + r.floor)
    # the recommendation is a measured configuration
    study = optuna.load_study(study_name=None, storage=sqlite_url(out))
    rec = next(t for t in study.trials if t.number == r.trial).user_attrs["record"]
    assert rec["launched"] and rec["capacity_rps"] == r.capacity_rps


def test_one_knob_a_row_with_predicted_shares_beside_the_measured_total(strict):
    out, _ = strict
    rep = json.loads((out / "report.json").read_text())
    steps = rep["attribution"]
    assert steps and all(len(s["rows"]) == len(s["knobs_changed"]) for s in steps)
    multi = [s for s in steps if len(s["rows"]) > 1]
    assert multi, "the twin's first verification changed several knobs at once"
    for s in multi:
        assert {row["source"] for row in s["rows"]} <= {"predicted", "measured"}
        assert all(row["predicted_share_pct"] is not None for row in s["rows"])
    md = (out / "report.md").read_text()
    table = md.split("## Where the gain came from, knob by knob")[1].split("\n## ")[0]
    lines = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| trial")]
    assert len(lines) == sum(len(s["rows"]) for s in steps)  # one knob a row
    assert all(ln.count(" -> ") >= 1 for ln in lines)
    assert "(predicted)" in table and re.search(r"-> [\d.]+ \([+-][\d.]+%\)", table)  # the measured total
    assert (out / "plots" / "shares.svg").exists()
    # knobs within noise were dropped and the simpler configuration launched before it was recommended
    simp = rep.get("simplification")
    if simp and simp.get("trial") is not None:
        assert len(changed_knobs(simp["knobs"], None)) < len(changed_knobs(rep["best"]["knobs"], None))
        assert any(t["number"] == simp["trial"] and t["role"] == "simplify" for t in rep["trials"])
