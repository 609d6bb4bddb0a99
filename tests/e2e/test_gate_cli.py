"""`tune gate` as CI runs it: exit codes, verdict and JUnit XML, on the gate a real `tune` run wrote."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET

import pytest
import yaml

from tests.conftest import ROOT
from tests.e2e.test_report_cli import tuned_run
from tests.e2e.test_workload_cli import assert_user_error, tune

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    """The gate the README's main job wrote (the run the report and plan tests read too: one study for
    all of them, not another for a gate of vLLM's defaults): its recommended configuration, gated."""
    return tuned_run(tmp_path_factory, 4) / "gate.yaml"


def test_unchanged_config_passes(gate, tmp_path):
    g = yaml.safe_load(gate.read_text())
    recommended = json.loads((gate.parent / "report.json").read_text())["recommendation"]["knobs"]
    assert g["knobs"] == recommended and g["tolerance"] == 0.1 and g["workload"]["path"] == "workloads/chat.jsonl"
    p = tune("gate", gate, "--junit", tmp_path / "gate.xml", cwd=ROOT)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert p.stdout.startswith("gate: PASS")
    assert f"gated {g['capacity_rps']:.3g} x 0.9" in p.stdout
    suite = ET.parse(tmp_path / "gate.xml").getroot().find("testsuite")
    assert suite.get("failures") == "0" and int(suite.get("tests")) == 4


def test_a_slower_config_fails(gate, tmp_path):
    p = tune("gate", gate, "--config-override", "max_num_seqs=4", "--junit", tmp_path / "gate.xml", cwd=ROOT)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert p.stdout.startswith("gate: FAIL") and "max_num_seqs=4" in p.stdout and "SLO BROKEN" in p.stdout
    suite = ET.parse(tmp_path / "gate.xml").getroot().find("testsuite")
    assert suite.get("failures") == "1"


def test_full_capacity_search_passes_unchanged(gate):
    p = tune("gate", gate, "--full", cwd=ROOT)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "[ok] capacity" in p.stdout


def test_a_changed_slo_is_exit_2_unless_allowed(gate, tmp_path):
    slo = tmp_path / "chat.slo.yaml"
    shutil.copy(ROOT / "workloads" / "chat.slo.yaml", slo)
    slo.write_text(slo.read_text().replace("max_ms: 300", "max_ms: 250"))
    p = tune("gate", gate, "--slo", slo, "--junit", tmp_path / "j.xml", cwd=ROOT)
    assert_user_error(p, f"slo {slo} CHANGED since the gate was written")
    assert ET.parse(tmp_path / "j.xml").getroot().find("testsuite").get("errors") == "1"
    allowed = tune("gate", gate, "--slo", slo, "--allow-changed", cwd=ROOT)
    assert allowed.returncode in (0, 1), allowed.stderr        # compared now, whatever the verdict
    assert "CHANGED" in allowed.stdout


def test_the_gate_travels_with_its_inputs(gate, tmp_path):
    """Recorded relative paths resolve against the gate file's directory too (a committed gate)."""
    d = tmp_path / "repo"
    (d / "workloads").mkdir(parents=True)
    for f in ("chat.jsonl", "chat.slo.yaml"):
        shutil.copy(ROOT / "workloads" / f, d / "workloads" / f)
    shutil.copy(gate, d / "gate.yaml")
    p = tune("gate", d / "gate.yaml", cwd=tmp_path)
    assert p.returncode == 0, (p.stdout, p.stderr)


@pytest.mark.parametrize("args,expected", [
    (["--config-override", "max_num_seqs"], "--config-override: expected key=value"),
    (["--config-override", "num_gpus=2"], "--config-override: unknown knob 'num_gpus'"),
    (["--engine", "trt"], "--engine: unknown engine 'trt'"),
])
def test_bad_input_is_exit_2(gate, args, expected):
    assert_user_error(tune("gate", gate, *args, cwd=ROOT), expected)


def test_missing_gate_file(tmp_path):
    assert_user_error(tune("gate", tmp_path / "gate.yaml"), f"{tmp_path / 'gate.yaml'}: no such file")
