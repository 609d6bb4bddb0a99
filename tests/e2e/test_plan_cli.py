"""`tune plan` as a user runs it: REFERENCE.md's worked example, an infeasible SLO, bad input."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_workload_cli import assert_user_error, tune

pytestmark = pytest.mark.e2e


def test_worked_example_gives_ten_instances():
    p = tune("plan", "--rate-per-instance", "7.8125", "--peak-rate", "50", "--headroom", "0.7")
    assert p.returncode == 0, p.stderr
    assert "ceil(50 / (0.7 x 7.812)) = ceil(9.14) = 10" in p.stdout
    assert "GPUs: 10 x TP 1 = 10; with 1 spare for failures: 11 instances = 11 GPUs" in p.stdout
    j = tune("plan", "--rate-per-instance", "7.8125", "--peak-rate", "50", "--headroom", "0.7", "--json")
    assert j.returncode == 0, j.stderr
    data = json.loads(j.stdout)
    assert data["instances"] == 10 and data["gpus"] == 10 and data["instances_with_spare"] == 11


def test_tokens_per_second_form_of_the_worked_example():
    p = tune("plan", "--tokens-per-s", "2000", "--mean-output-tokens", "256", "--peak-rate", "50", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["instances"] == 10


def test_full_plan_with_gpu_model_slo_and_price(tmp_path):
    slo = tmp_path / "s.yaml"
    slo.write_text("ttft_ms: 300\ntpot_ms: 50\npeak_rate: 50\nprice_per_gpu_hour: 0.8\n")
    p = tune("plan", "--rate-per-instance", "7.8125", "--gpu", "rtx4090", "--model", "Qwen/Qwen2.5-7B-Instruct",
             "--slo", slo, "--mean-prompt-tokens", "512", "--mean-output-tokens", "256", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["feasible"] and d["instances"] == 10 and d["feasibility"]["tpot_floor_ms"] == pytest.approx(21.5, abs=0.2)
    assert d["memory_gate"]["kv_bytes_per_token"] == 57344
    assert d["cost_per_hour"] == pytest.approx(8.0) and d["cost_per_month"] == pytest.approx(8.0 * 730)


def test_an_slo_below_the_decode_floor_says_so_instead_of_a_number(tmp_path):
    slo = tmp_path / "fast.slo.yaml"
    slo.write_text("tpot_ms: 15\npeak_rate: 50\n")
    p = tune("plan", "--rate-per-instance", "7.8", "--gpu", "rtx4090", "--model", "Qwen/Qwen2.5-7B-Instruct",
             "--slo", slo)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert p.stdout.startswith("INFEASIBLE") and "below the decode floor" in p.stdout
    assert "instances" not in p.stdout and "GPUs" not in p.stdout
    j = tune("plan", "--rate-per-instance", "7.8", "--gpu", "rtx4090", "--model", "Qwen/Qwen2.5-7B-Instruct",
             "--slo", slo, "--json")
    assert j.returncode == 1
    d = json.loads(j.stdout)
    assert d["feasible"] is False and d["instances"] is None and d["gpus"] is None


@pytest.mark.parametrize("args,expected", [
    (["--peak-rate", "50"], "--rate-per-instance: give a run directory, or --rate-per-instance"),
    (["--rate-per-instance", "5"], "--peak-rate: give --peak-rate"),
    (["--rate-per-instance", "5", "--peak-rate", "50", "--headroom", "2"], "--headroom: must be in (0, 1]"),
    (["--rate-per-instance", "5", "--peak-rate", "50", "--gpu", "h900", "--model", "qwen2.5-7b"],
     "--gpu: unknown GPU 'h900'"),
])
def test_bad_input_is_one_line_and_exit_2(args, expected):
    assert_user_error(tune("plan", *args), expected)


def test_not_a_run_directory(tmp_path):
    assert_user_error(tune("plan", tmp_path / "nope"), f"{tmp_path / 'nope'}: no such run directory")


def test_plan_from_a_run_directory(tmp_path_factory):
    import math

    from tests.conftest import ROOT
    from tests.e2e.test_report_cli import tuned_run

    run = tuned_run(tmp_path_factory, 4)
    tuned = json.loads((run / "report.json").read_text())["tuned"]
    cap = tuned["capacity_low_rps"] or tuned["capacity_rps"]  # the plan sizes for the clear pass
    p = tune("plan", run, "--json", cwd=ROOT)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["speed_gate_rps"] == cap and d["peak_rate"] == 50 and d["headroom"] == 0.7
    assert d["instances"] == math.ceil(50 / (0.7 * cap)) and d["gpus"] == d["instances"]
    assert d["memory_gate"]["kv_pool_tokens"] > 0
    over = tune("plan", run, "--peak-rate", "100", "--json", cwd=ROOT)
    assert json.loads(over.stdout)["instances"] == math.ceil(100 / (0.7 * cap))
