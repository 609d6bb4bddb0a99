"""Regression gate: the file a run leaves, its validation, and re-measurement on the in-process simulator."""

from __future__ import annotations

import hashlib
import shutil
import xml.etree.ElementTree as ET

import pytest
import yaml

from tests.unit.test_report_fixtures import SLO_FILE, WORKLOAD, fixture_study
from tuner.errors import UserError
from tuner.gate import (apply_overrides, default_load, load_gate, run_gate, write_gate,
                        write_junit)
from tuner.storage.reader import load_study_data


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return fixture_study(tmp_path_factory)


def _trial(run, knobs: dict):
    return next(t for t in load_study_data(run).trials if t.record.knobs == knobs)


def test_gate_file_carries_knobs_hashes_capacity_and_tolerance(run, tmp_path):
    path = write_gate(run, path=tmp_path / "gate.yaml")
    g = load_gate(path)
    data = load_study_data(run)
    tuned = next(t for t in data.trials if t.number == data.outcome["tuned_trial"]).record
    assert g.knobs == tuned.knobs and g.capacity_rps == tuned.capacity_rps
    assert g.capacity_upper_rps == tuned.capacity_upper_rps
    assert g.attainment_ci is not None and g.attainment_ci[0] <= g.attainment <= g.attainment_ci[1]
    assert g.workload.sha256 == hashlib.sha256(WORKLOAD.read_bytes()).hexdigest()
    assert g.slo.sha256 == hashlib.sha256(SLO_FILE.read_bytes()).hexdigest()
    assert g.tolerance == 0.10 and g.check_rate == pytest.approx(0.9 * g.capacity_rps)
    assert (g.engine, g.gpu, g.model) == ("sim", "rtx4090", "Qwen/Qwen2.5-7B-Instruct")
    assert g.load == default_load("sim")
    assert path.read_text().startswith("# Regression gate")


def test_gate_for_a_chosen_trial_and_nothing_to_gate(run, tmp_path):
    base = _trial(run, {})
    g = load_gate(write_gate(run, path=tmp_path / "g.yaml", trial=base.number))
    assert g.knobs == {} and g.capacity_rps == base.record.capacity_rps
    failed = next(t for t in load_study_data(run).trials if t.state == "FAIL")
    with pytest.raises(UserError, match="no measured capacity"):
        write_gate(run, path=tmp_path / "x.yaml", trial=failed.number)


@pytest.mark.parametrize("text,match", [
    ("engine: sim\n  bad: [", "invalid YAML"),
    ("- 1\n", "expected a mapping"),
    ("engine: sim\n", "workload: missing"),
])
def test_a_bad_gate_file_is_a_user_error(tmp_path, text, match):
    p = tmp_path / "gate.yaml"
    p.write_text(text)
    with pytest.raises(UserError, match=match):
        load_gate(p)


def test_unknown_fields_knobs_and_load_keys_are_rejected(run, tmp_path):
    good = yaml.safe_load(write_gate(run, path=tmp_path / "g.yaml").read_text())
    for change, match in [({"capacity": 3}, "unknown field"), ({"knobs": {"max_num_seqs": 0}}, "knobs"),
                          ({"load": {"requests": 10, "rps": 1}}, "unknown key 'rps'"),
                          ({"capacity_rps": -1}, "must be > 0")]:
        p = tmp_path / "bad.yaml"
        p.write_text(yaml.safe_dump({**good, **change}))
        with pytest.raises(UserError, match=match):
            load_gate(p)
    with pytest.raises(UserError, match="no such file"):
        load_gate(tmp_path / "missing.yaml")


def test_a_hand_edited_launch_is_refused_not_gated(run, tmp_path):
    """A gate re-measures the launch the study measured: knobs or extra_args edited without serve_args
    would gate what no study measured (a max_num_seqs that cannot launch reads as a regression, an edited
    extra_args as a pass). Another configuration goes through --config-override, which is checked."""
    good = yaml.safe_load(write_gate(run, path=tmp_path / "g.yaml").read_text())
    for change, field in [({"knobs": {**good["knobs"], "max_num_seqs": 1_000_000_000}}, "knobs"),
                          ({"extra_args": ["--enforce-eager"]}, "extra_args")]:
        p = tmp_path / "edited.yaml"
        p.write_text(yaml.safe_dump({**good, **change}))
        with pytest.raises(UserError, match="do not make its serve_args") as e:
            load_gate(p)
        assert e.value.field == field and e.value.line is not None
    for rates, match in [({"ngram": 2.0}, "fraction 0..1"), ({"telepathy": 0.5}, "not a vLLM speculative method")]:
        p = tmp_path / "spec.yaml"
        p.write_text(yaml.safe_dump({**good, "spec_acceptance": rates}))
        with pytest.raises(UserError, match=match):
            load_gate(p)
    p = tmp_path / "schema.yaml"
    p.write_text(yaml.safe_dump({**good, "schema_version": 99}))
    with pytest.raises(UserError, match="schema_version"):
        load_gate(p)


def test_config_overrides():
    assert apply_overrides({"kv_cache_dtype": "fp8"}, ["max-num-seqs=4"]) == {"kv_cache_dtype": "fp8",
                                                                              "max_num_seqs": 4}
    assert apply_overrides({"kv_cache_dtype": "fp8"}, ["kv_cache_dtype=default"]) == {}
    assert apply_overrides({}, ["enable_prefix_caching=false"]) == {"enable_prefix_caching": False}
    assert apply_overrides({}, ["gpu_memory_utilization=0.85"]) == {"gpu_memory_utilization": 0.85}
    for bad, match in [("max_num_seqs", "key=value"), ("num_gpus=2", "unknown knob"),
                       ("max_num_seqs=-3", "greater than or equal to 1")]:
        with pytest.raises(UserError, match=match):
            apply_overrides({}, [bad])


def _baseline_gate(run, tmp_path):
    return write_gate(run, path=tmp_path / "gate.yaml", trial=_trial(run, {}).number)


def test_unchanged_config_passes_and_a_slower_one_fails_on_the_simulator(run, tmp_path):
    gate = _baseline_gate(run, tmp_path)
    ok = run_gate(gate, junit=tmp_path / "ok.xml", work_dir=tmp_path / "w")
    assert ok.exit_code == 0 and ok.verdict == "PASS", [c.message for c in ok.checks]
    slo_check = ok.checks[-1]
    assert slo_check.name.startswith("slo at") and "holds" in slo_check.message
    bad = run_gate(gate, overrides=["max_num_seqs=4"], junit=tmp_path / "bad.xml", work_dir=tmp_path / "w")
    assert bad.exit_code == 1 and bad.verdict == "FAIL"
    assert "BROKEN" in bad.checks[-1].message
    suite = ET.parse(tmp_path / "bad.xml").getroot().find("testsuite")
    assert suite.get("failures") == "1"
    failed = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None]
    assert failed == [bad.checks[-1].name]
    assert ET.parse(tmp_path / "ok.xml").getroot().find("testsuite").get("failures") == "0"


def test_a_configuration_that_no_longer_launches_fails(run, tmp_path):
    res = run_gate(_baseline_gate(run, tmp_path), overrides=["gpu_memory_utilization=0.999"])
    assert res.exit_code == 1
    assert res.checks[-1].name == "launch" and "memory_utilization" in res.checks[-1].message


def test_full_re_measures_the_capacity(run, tmp_path):
    res = run_gate(_baseline_gate(run, tmp_path), full=True)
    cap = next(c for c in res.checks if c.name == "capacity")
    assert cap.passed and res.measured_capacity_rps > 0
    assert res.exit_code == 0


def test_a_changed_workload_or_slo_is_reported_not_compared(run, tmp_path):
    gate = _baseline_gate(run, tmp_path)
    slo = tmp_path / "chat.slo.yaml"
    shutil.copy(SLO_FILE, slo)
    with slo.open("a") as f:
        f.write("# edited\n")
    with pytest.raises(UserError, match="slo .* CHANGED since the gate was written") as e:
        run_gate(gate, slo=str(slo), junit=tmp_path / "changed.xml")
    assert "--allow-changed" in str(e.value)
    suite = ET.parse(tmp_path / "changed.xml").getroot().find("testsuite")
    assert suite.get("errors") == "1"
    res = run_gate(gate, slo=str(slo), allow_changed=True)
    assert res.exit_code == 0
    assert any("CHANGED" in c.message and c.passed for c in res.checks)


def test_junit_is_well_formed(tmp_path):
    from tuner.gate import Check, GateResult

    r = GateResult(exit_code=1, verdict="FAIL", checks=[Check(name="a", passed=True, message="ok <x>"),
                                                        Check(name="b", passed=False, message="bad & worse")])
    root = ET.parse(write_junit(r, tmp_path / "sub" / "j.xml")).getroot()
    assert root.tag == "testsuites" and root.get("failures") == "1"
    assert root.find("testsuite/testcase[@name='b']/failure").get("message") == "bad & worse"
