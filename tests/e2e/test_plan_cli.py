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
    assert d["feasible"] and d["instances"] == 10
    assert d["feasibility"]["weight_floor_ms"] == pytest.approx(21.5, abs=0.2)
    assert [g["metric"] for g in d["feasibility"]["gates"]] == ["ttft", "tpot"]
    assert d["memory_gate"]["kv_bytes_per_token"] == 57344
    assert d["cost_per_hour"] == pytest.approx(8.0) and d["cost_per_month"] == pytest.approx(8.0 * 730)


def test_an_slo_below_the_decode_floor_says_so_instead_of_a_number(tmp_path):
    slo = tmp_path / "fast.slo.yaml"
    slo.write_text("tpot_ms: 15\npeak_rate: 50\n")
    p = tune("plan", "--rate-per-instance", "7.8", "--gpu", "rtx4090", "--model", "Qwen/Qwen2.5-7B-Instruct",
             "--slo", slo)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert p.stdout.startswith("INFEASIBLE") and "p99 TPOT 15 ms is below the single-stream floor" in p.stdout
    assert "instances" not in p.stdout and "GPUs" not in p.stdout
    j = tune("plan", "--rate-per-instance", "7.8", "--gpu", "rtx4090", "--model", "Qwen/Qwen2.5-7B-Instruct",
             "--slo", slo, "--json")
    assert j.returncode == 1
    d = json.loads(j.stdout)
    assert d["feasible"] is False and d["instances"] is None and d["gpus"] is None


def test_an_e2e_only_slo_no_configuration_meets_says_which_floor_breaks_it(tmp_path):
    # the case: a 70B AWQ model on one A100, 512-token prompts and outputs, p99 E2E 2 s
    slo = tmp_path / "e2e.slo.yaml"
    slo.write_text("e2el_ms: 2000\npeak_rate: 5\n")
    args = ["plan", "--rate-per-instance", "1", "--gpu", "a100", "--model", "Qwen/Qwen2.5-72B-Instruct-AWQ",
            "--slo", slo, "--mean-prompt-tokens", "512", "--mean-output-tokens", "512"]
    p = tune(*args)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and "instances" not in p.stdout
    first, *rest = p.stdout.splitlines()
    assert first.startswith("INFEASIBLE") and "(floors at the mean lengths)" in first
    (broken,) = [ln for ln in rest if ln.startswith("- ")]
    assert broken.startswith("- p99 E2E latency 2 s is below the single-stream floor of ")
    assert "prefill of 512 tokens + 511 x" in broken and "ms decode for a 512-token output" in broken
    d = json.loads(tune(*args, "--json").stdout)
    (g,) = d["feasibility"]["gates"]
    assert g["metric"] == "e2el" and not g["ok"] and g["floor_ms"] > 2000
    assert g["floor_ms"] == pytest.approx(g["prefill_ms"] + 511 * g["decode_step_ms"])


def test_prompts_beyond_the_model_context_are_infeasible_not_fifteen_gpus():
    p = tune("plan", "--rate-per-instance", "0.05", "--peak-rate", "0.5", "--gpu", "rtx4090", "--model",
             "Qwen/Qwen2.5-7B-Instruct", "--mean-prompt-tokens", "128000", "--mean-output-tokens", "256")
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "exceeds the 32,768-token context" in p.stdout and "GPUs" not in p.stdout


def test_a_run_with_no_capacity_says_why_with_the_study_exit_code(tmp_path):
    from tests.e2e.conftest import TUNE_FIX, WORKLOAD
    from tuner.storage.status import EXIT_NO_PASS

    run = tmp_path / "run"
    t = tune("--workload", WORKLOAD, "--slo", TUNE_FIX / "impossible.slo.yaml", "--engine", "sim", "--gpu",
             "rtx4090", "--model", "qwen2.5-7b", "--search-space", TUNE_FIX / "space2.yaml", "--max-trials", "3",
             "--requests-per-run", "300", "--out", run)
    assert t.returncode == EXIT_NO_PASS, t.stderr[-2000:]
    p = tune("plan", run)
    assert p.returncode == EXIT_NO_PASS, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and p.stdout == ""
    first, *rest = p.stderr.splitlines()
    assert first.startswith(f"error: {run}: no capacity to plan for: no configuration met the SLO at any "
                            "offered rate") and "the knee search said: p90 TPOT 1 ms is below" in first
    assert any(ln.startswith("- p90 TPOT 1 ms is below the single-stream floor") for ln in rest), rest


@pytest.mark.parametrize("args,expected", [
    (["--peak-rate", "50"], "--rate-per-instance: give a run directory, or --rate-per-instance"),
    (["--rate-per-instance", "5"], "--peak-rate: give --peak-rate"),
    (["--rate-per-instance", "5", "--peak-rate", "50", "--headroom", "2"], "--headroom: must be in (0, 1]"),
    (["--rate-per-instance", "5", "--peak-rate", "50", "--gpu", "h900", "--model", "qwen2.5-7b"],
     "--gpu: unknown GPU 'h900'"),
    (["--rate-per-instance", "5", "--peak-rate", "50", "--price-per-gpu-hour", "nan"],
     "--price-per-gpu-hour: must be a finite number >= 0"),
    (["--rate-per-instance", "5", "--peak-rate", "50", "--price-per-gpu-hour", "-1"],
     "--price-per-gpu-hour: must be a finite number >= 0"),
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
    rep = json.loads((run / "report.json").read_text())
    tuned, rec = rep["tuned"], rep["recommendation"]
    # the plan sizes for the capacity the headline states: the paired check's where it decided (one
    # capacity everywhere), else the knee search's clear pass
    cap = rec["capacity_rps"] if rec.get("paired") else tuned["capacity_low_rps"] or tuned["capacity_rps"]
    p = tune("plan", run, "--json", cwd=ROOT)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["speed_gate_rps"] == cap and d["peak_rate"] == 50 and d["headroom"] == 0.7
    assert d["instances"] == math.ceil(50 / (0.7 * cap)) and d["gpus"] == d["instances"]
    assert d["memory_gate"]["kv_pool_tokens"] > 0
    over = tune("plan", run, "--peak-rate", "100", "--json", cwd=ROOT)
    assert json.loads(over.stdout)["instances"] == math.ceil(100 / (0.7 * cap))
