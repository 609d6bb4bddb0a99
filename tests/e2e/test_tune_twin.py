"""`tune --strategy twin` as a user runs it: the twin is fitted to the launches, ranks the whole space,
and what it predicted before each launch is in the storage and the report beside what was measured."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from tests.e2e.conftest import GPU, MODEL, SLO, TUNE_FIX, WORKLOAD, sqlite_url, tune

pytestmark = pytest.mark.e2e
SPACE = TUNE_FIX / "space-twin.yaml"


def test_twin_study_verifies_its_predictions(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = tune("--workload", WORKLOAD, "--slo", SLO, "--engine", "sim", "--gpu", GPU, "--model", MODEL,
             "--search-space", SPACE, "--strategy", "twin", "--max-trials", "3", "--requests-per-run", "300",
             "--out", out, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "twin fitted to trial 0" in p.stderr and "twin ranked" in p.stderr
    study = optuna.load_study(study_name=None, storage=sqlite_url(out))
    log = study.user_attrs["twin"]
    assert log["fits"] and log["fits"][0]["trials"] == [0]
    assert log["fits"][0]["loss"] <= log["fits"][0]["nominal_loss"]
    # every configuration of the space (8, less those the constraint forbids) was predicted
    assert log["configurations"] >= 7
    launched = [t for t in study.trials if t.user_attrs.get("record", {}).get("launched")]
    assert 1 <= len(launched) <= 3
    rep = json.loads((out / "report.json").read_text())
    tw = rep["twin"]
    assert tw["configurations"] == log["configurations"]
    assert len(tw["ranking"]) == min(10, log["configurations"])
    for v in tw["verified"]:  # each prediction was stored before its launch, beside what was measured
        assert v["predicted_rps"] and (v["raced_out"] or v["measured_rps"])
        if v["measured_rps"]:
            assert v["error"] == pytest.approx(v["predicted_rps"] / v["measured_rps"] - 1)
    md = (out / "report.md").read_text()
    assert "The twin: predicted against measured" in md and "Twin fits" in md


def test_twin_needs_a_gpu_and_model_profile(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = tune("--workload", WORKLOAD, "--slo", SLO, "--engine", "vllm", "--model", "x", "--strategy", "twin",
             "--out", out, timeout=60)
    assert p.returncode == 2, p.stderr
    assert "--strategy twin needs --gpu and --model" in p.stderr
    assert "Traceback" not in p.stderr and not out.exists()
