"""Capacity plan arithmetic against REFERENCE.md section 1, the profiles and `resolve`."""

from __future__ import annotations

import math

import pytest

from tuner.errors import UserError
from tuner.floors import Lengths, context_check, gate_floors
from tuner.knobs import Knobs
from tuner.plan import HOURS_PER_MONTH, feasibility, format_plan, make_plan, memory_gate
from tuner.profiles.gpus import get_gpu
from tuner.profiles.models import get_model
from tuner.sim.config import resolve
from tuner.sim.costs import CostModel
from tuner.engine.virtual import SimRequest, run_virtual
from tuner.slo import SLO

QWEN, GPU = "Qwen/Qwen2.5-7B-Instruct", "rtx4090"


def test_reference_worked_example_is_ten_instances():
    # lambda_peak = 50 req/s, rho = 0.7, r_inst = 2000 / 256 = 7.8125 req/s -> ceil(9.14) = 10
    p = make_plan(rate_per_instance=2000 / 256, peak_rate=50, headroom=0.7)
    assert p.feasible and p.instances == 10 and p.gpus == 10
    assert p.instances_exact == pytest.approx(50 / (0.7 * 7.8125))
    assert p.instances_with_spare == 11 and p.gpus_with_spare == 11
    assert p.binding_gate == "speed"
    assert "ceil(9.14) = 10" in format_plan(p)
    # the peak itself, with no headroom: ceil(50 / 7.8125) = ceil(6.4) = 7, the N a fleet simulation checks
    assert p.instances_at_peak == 7
    assert "at the peak with no headroom: ceil(50 / 7.812) = 7" in format_plan(p)
    assert "adds 3 for growth and bursts" in format_plan(p)


def test_an_exact_quotient_is_not_rounded_up_by_float_error():
    # 7 / (0.7 x 10) is 1.0000000000000002 in floating point: still one instance
    assert make_plan(rate_per_instance=10, peak_rate=7, headroom=0.7).instances == 1


def test_decode_floor_matches_the_reference_and_the_simulator():
    f = feasibility(get_gpu(GPU), QWEN, SLO(tpot=50))
    assert f.weight_floor_ms == pytest.approx(21.5, abs=0.2)     # 15.2 GB / (0.7 x 1008 GB/s)
    # the TPOT floor is the simulator's own single-stream step: the weights plus KV and step overhead
    cost = CostModel(resolve(get_gpu(GPU), get_model(QWEN), Knobs()))
    assert f.weight_floor_ms == pytest.approx(cost.decode_floor() * 1000, rel=1e-9)
    assert f.tpot_floor_ms == pytest.approx(cost.step_time(0, 0, 0, 1, 2, 1) * 1000, rel=1e-9)
    assert f.weight_floor_ms < f.tpot_floor_ms < f.weight_floor_ms + 2
    assert f.feasible


def test_an_slo_below_the_decode_floor_is_infeasible_not_a_number():
    p = make_plan(rate_per_instance=7.8, peak_rate=50, gpu=GPU, model=QWEN, slo=SLO(tpot=15))
    assert not p.feasible and p.instances is None and p.gpus is None
    text = format_plan(p)
    assert text.startswith("INFEASIBLE") and "p99 TPOT 15 ms is below the single-stream floor" in text
    assert "instances" not in text
    # quantized weights lower the floor below 15 ms: the same SLO becomes feasible (fp8: 8.7 GB)
    q = make_plan(rate_per_instance=7.8, peak_rate=50, gpu=GPU, model=QWEN, slo=SLO(tpot=15),
                  knobs=Knobs(quantization="fp8"))
    assert q.feasible and q.feasibility.tpot_floor_ms < 15


def test_tensor_parallelism_splits_the_floor_and_multiplies_gpus():
    one = feasibility(get_gpu(GPU), QWEN, None)
    two = feasibility(get_gpu(GPU), QWEN, None, tp=2)
    assert two.weight_floor_ms == pytest.approx(one.weight_floor_ms / 2)
    p = make_plan(rate_per_instance=7.8125, peak_rate=50, headroom=0.7, tp=2)
    assert p.instances == 10 and p.gpus == 20 and p.gpus_with_spare == 22


# --- floors of every SLO metric (tuner.floors): the simulator's own single-stream request -------------------

def single_request(model: str, gpu: str, prompt: int, output: int):
    """What the simulated engine measures for one request alone (one prefill chunk: the budget covers it)."""
    cfg = resolve(get_gpu(gpu), get_model(model), Knobs(max_num_batched_tokens=max(prompt, 2048)))
    return cfg, run_virtual(cfg, [SimRequest(0.0, prompt, output)]).records[0]


def gate(slo: SLO, model: str, gpu: str, prompt: int, output: int):
    cfg, _ = single_request(model, gpu, prompt, output)
    (g,) = gate_floors(cfg, slo, Lengths.means(prompt, output))
    return g


def test_ttft_floor_is_the_simulated_single_stream_prefill():
    _, rec = single_request(QWEN, GPU, 4000, 64)
    g = gate(SLO(ttft=200), QWEN, GPU, 4000, 64)
    assert g.floor_ms == pytest.approx(rec.ttft * 1000, rel=1e-9)
    assert not g.ok and g.floor_ms > 200  # 4000 tokens of prefill of a 7B on a 4090 take longer
    assert g.message.startswith("p99 TTFT 200 ms is below the single-stream floor") and "4,000-token" in g.message
    assert gate(SLO(ttft=g.floor_ms * 1.01), QWEN, GPU, 4000, 64).ok


def test_tpot_floor_is_the_simulated_mean_decode_step():
    _, rec = single_request(QWEN, GPU, 2000, 300)
    g = gate(SLO(tpot=20), QWEN, GPU, 2000, 300)
    assert g.floor_ms == pytest.approx(rec.tpot * 1000, rel=1e-9)
    assert not g.ok and "15.2 GB of weights" in g.message
    # the ITL floor is the request's last (largest) step: above the mean step
    i = gate(SLO(itl=20), QWEN, GPU, 2000, 300)
    assert i.floor_ms > g.floor_ms and i.floor_ms == pytest.approx(max(rec.itls) * 1000, rel=1e-6)


def test_e2e_floor_is_prefill_plus_decode_steps_and_names_its_parts():
    # the case: a 70B AWQ model on A100, 512-token outputs, a 2 s end-to-end SLO
    awq, a100 = "Qwen/Qwen2.5-72B-Instruct-AWQ", "a100"
    _, rec = single_request(awq, a100, 512, 512)
    g = gate(SLO(e2el=2000), awq, a100, 512, 512)
    assert g.floor_ms == pytest.approx(rec.e2el * 1000, rel=1e-9)
    assert g.floor_ms == pytest.approx(g.prefill_ms + 511 * g.decode_step_ms)
    assert not g.ok
    assert "p99 E2E latency 2 s is below the single-stream floor of" in g.message
    assert "prefill of 512 tokens + 511 x" in g.message and "512-token output" in g.message


def test_an_e2e_only_slo_no_configuration_meets_is_infeasible_and_says_which_floor():
    p = make_plan(rate_per_instance=1, peak_rate=5, gpu="a100", model="Qwen/Qwen2.5-72B-Instruct-AWQ",
                  slo=SLO(e2el=2000), mean_prompt_tokens=512, mean_output_tokens=512)
    assert not p.feasible and p.instances is None
    lines = format_plan(p).splitlines()
    assert lines[0].startswith("INFEASIBLE") and "mean lengths" in lines[0]
    broken = [ln for ln in lines if ln.startswith("- ")]
    assert len(broken) == 1 and "E2E latency 2 s" in broken[0]
    # one line per broken gate: a TTFT below its floor too adds its own line
    both = make_plan(rate_per_instance=1, peak_rate=5, gpu="a100", model="Qwen/Qwen2.5-72B-Instruct-AWQ",
                     slo=SLO(e2el=2000, ttft=100), mean_prompt_tokens=512, mean_output_tokens=512)
    assert sorted(ln.split()[2] for ln in format_plan(both).splitlines() if ln.startswith("- ")) == ["E2E", "TTFT"]


def test_floors_decide_at_the_slo_target_over_the_workload_requests():
    # 95 short requests and 5 long ones: a p90 TTFT between their floors holds, a p99 one cannot
    short, long = 256, 8000
    lengths = Lengths(tuple([short] * 95 + [long] * 5), (64,) * 100, (0,) * 100, "the workload's 100 requests")
    cfg = resolve(get_gpu(GPU), get_model(QWEN), Knobs())
    lo = gate_floors(cfg, SLO(ttft=200), Lengths.means(short, 64))[0].floor_ms
    hi = gate_floors(cfg, SLO(ttft=200), Lengths.means(long, 64))[0].floor_ms
    mid = (lo + hi) / 2
    (p90,) = gate_floors(cfg, SLO(ttft={"max_ms": mid, "percentile": 90}), lengths)
    (p99,) = gate_floors(cfg, SLO(ttft={"max_ms": mid, "percentile": 99}), lengths)
    assert p90.ok and p90.prompt_tokens == short
    assert not p99.ok and p99.prompt_tokens == long and "of 100" in p99.message


def test_the_old_64_token_gemm_floor_no_longer_makes_batch_one_awq_compute_bound():
    # W4A16 decode at batch 1 is memory-bound (Marlin): the step is the weights read plus overheads
    cost = CostModel(resolve(get_gpu("a100"), get_model("Qwen/Qwen2.5-72B-Instruct-AWQ"), Knobs()))
    step = cost.step_time(0, 0, 0, 1, 1000, 1)
    assert step < cost.decode_floor() * 1.1
    # and a large batch still becomes compute-bound (Marlin's speed-up fades past a few dozen tokens)
    assert cost.step_time(0, 0, 0, 128, 128_000, 128) > 2 * cost.decode_floor()


# --- the model's context -------------------------------------------------------------------------------

def test_a_prompt_beyond_the_model_context_is_infeasible_with_the_reason():
    # the case: 128k prompts on an RTX 4090 with a 32k-context model planned 15 GPUs
    p = make_plan(rate_per_instance=0.05, peak_rate=0.5, gpu=GPU, model=QWEN, mean_prompt_tokens=128_000,
                  mean_output_tokens=256)
    assert not p.feasible and p.instances is None
    assert "exceeds the 32,768-token context" in p.reason and "max_position_embeddings" in p.reason
    c = p.feasibility.context
    assert c.max_model_len == 32_768 and c.over == 1 and not c.ok


def test_a_few_requests_beyond_the_context_warn_and_max_model_len_sets_the_limit():
    cfg = resolve(get_gpu(GPU), get_model(QWEN), Knobs(max_model_len=8192))
    lengths = Lengths((1000,) * 999 + (9000,), (100,) * 1000, (0,) * 1000, "the workload's 1000 requests")
    c = context_check(cfg, lengths, 0.99)
    assert c.ok and c.over == 1 and c.max_model_len == 8192 and c.limit_source == "--max-model-len"
    assert "1 of 1000 requests" in c.message and "8,192-token context" in c.message
    p = make_plan(rate_per_instance=1, peak_rate=5, gpu=GPU, model=QWEN, knobs=Knobs(max_model_len=8192),
                  slo=SLO(tpot=50), mean_prompt_tokens=1000, mean_output_tokens=100, lengths=lengths)
    assert p.feasible and any(n.startswith("warning: 1 of 1000 requests") for n in p.notes)
    assert not context_check(cfg, lengths, 0.9995).ok  # a stricter target cannot lose that request


def test_memory_gate_is_the_kv_pool_over_the_mean_sequence():
    m = memory_gate(get_gpu(GPU), QWEN, Knobs(), mean_prompt_tokens=512, mean_output_tokens=256)
    cfg = resolve(get_gpu(GPU), get_model(QWEN), Knobs())
    assert m.kv_bytes_per_token == 57_344                      # 2 x 28 x 4 x 128 x 2 B (REFERENCE.md)
    assert m.kv_pool_tokens == cfg.kv_cache_tokens
    assert m.sequences_by_kv == pytest.approx(cfg.kv_cache_tokens / 768)
    assert m.concurrent_sequences == min(m.sequences_by_kv, 256)
    fp8 = memory_gate(get_gpu(GPU), QWEN, Knobs(kv_cache_dtype="fp8"), mean_prompt_tokens=512,
                      mean_output_tokens=256)
    assert fp8.kv_bytes_per_token == 57_344 // 2 and fp8.kv_pool_tokens > 1.9 * m.kv_pool_tokens


def test_memory_gate_binds_a_quoted_rate_the_kv_pool_cannot_hold():
    slo = SLO(ttft=300, tpot=50)
    p = make_plan(rate_per_instance=100, peak_rate=50, gpu=GPU, model=QWEN, slo=slo,
                  mean_prompt_tokens=512, mean_output_tokens=256)
    m = p.memory_gate
    # Little's law with the longest lifetime the SLO allows: 0.3 s + 255 x 50 ms
    assert m.e2el_s == pytest.approx(0.3 + 255 * 0.05)
    assert p.binding_gate == "memory" and p.rate_per_instance == pytest.approx(m.rate_rps)
    assert p.instances == math.ceil(50 / (0.7 * m.rate_rps))
    # a knee measured on this configuration already includes the KV limit: the gate is a cross-check
    q = make_plan(rate_per_instance=100, peak_rate=50, gpu=GPU, model=QWEN, slo=slo,
                  mean_prompt_tokens=512, mean_output_tokens=256, memory_can_bind=False)
    assert q.binding_gate == "speed" and q.instances == 1 and any("cross-check" in n for n in q.notes)


def test_cost_per_hour_and_month():
    p = make_plan(rate_per_instance=7.8125, peak_rate=50, headroom=0.7, price_per_gpu_hour=2.5)
    assert p.cost_per_hour == 25.0 and p.cost_per_month == 25.0 * HOURS_PER_MONTH
    assert p.cost_per_hour_with_spare == 27.5


def test_a_configuration_that_does_not_launch_has_no_memory_gate():
    with pytest.raises(UserError, match="does not launch"):
        memory_gate(get_gpu(GPU), "Qwen/Qwen2.5-72B-Instruct", Knobs(), mean_prompt_tokens=512,
                    mean_output_tokens=256)


@pytest.mark.parametrize("kwargs,field", [
    (dict(rate_per_instance=0, peak_rate=50), "--rate-per-instance"),
    (dict(rate_per_instance=float("nan"), peak_rate=50), "--rate-per-instance"),
    (dict(rate_per_instance=5, peak_rate=-1), "--peak-rate"),
    (dict(rate_per_instance=5, peak_rate=50, headroom=1.5), "--headroom"),
    (dict(rate_per_instance=5, peak_rate=50, tp=0), "--tp"),
    (dict(rate_per_instance=5, peak_rate=50, gpu=GPU), "--model"),
])
def test_bad_numbers_are_user_errors(kwargs, field):
    with pytest.raises(UserError) as e:
        make_plan(**kwargs)
    assert e.value.field == field


# --- a run with no measured capacity -------------------------------------------------------------------

def _recorded_lengths(path) -> dict:
    """The per-request lengths a study records at its start (`tuner.study`)."""
    from tuner.floors import Lengths
    from tuner.workload.loader import load_workload

    ls = Lengths.of_workload(load_workload(path))
    return {"prompt": list(ls.prompt), "output": list(ls.output), "cached": list(ls.cached)}


def no_capacity_study(run, *, launched: bool) -> None:
    """A stored study whose only trial measured no capacity: launched and failed the SLO at every rate
    (its knee search's reason stored), or never launched."""
    import optuna

    from tests.conftest import ROOT
    from tuner.storage.records import LoadRunSummary, StudyInfo, TrialRecord
    from tuner.inputs import file_sha256 as sha256

    wl = ROOT / "tests" / "fixtures" / "tune" / "tiny.jsonl"
    info = StudyInfo(workload_path=str(wl), workload_sha256=sha256(wl), workload_requests=20,
                     workload_mean_prompt_tokens=200, workload_mean_output_tokens=100, slo_path="s.yaml",
                     slo_sha256="0", slo=SLO(tpot=1, peak_rate=5).model_dump(mode="json"), engine="sim",
                     simulated=True, gpu=GPU, model=QWEN, workload_lengths=_recorded_lengths(wl))
    fail = LoadRunSummary(rate=1.0, n=50, attainment=0.0, ci_low=0.0, ci_high=0.07, passed=False, goodput=0.0)
    rec = (TrialRecord(role="baseline", launched=True, load_runs=[fail],
                       no_capacity_reason="p99 TPOT 1 ms is below this engine's single-stream TPOT of 23.1 ms")
           if launched else TrialRecord(role="baseline", launch_failure_kind="oom",
                                        launch_failure_message="CUDA out of memory"))
    study = optuna.create_study(storage=f"sqlite:///{run / 'study.db'}", study_name="slo-tuner",
                                direction="maximize")
    study.set_user_attr("info", info.model_dump(mode="json"))
    study.add_trial(optuna.trial.create_trial(value=0.0, user_attrs={"record": rec.model_dump(mode="json")}))


@pytest.mark.parametrize("launched,status,exit_code,says", [
    (True, "no_pass", 4, "no configuration met the SLO at any offered rate"),
    (False, "no_launch", 3, "no configuration launched"),
])
def test_a_run_without_capacity_explains_why_with_the_study_exit_code(tmp_path, launched, status, exit_code,
                                                                      says):
    from tuner.plan import NoCapacity, plan_from_run

    no_capacity_study(tmp_path, launched=launched)
    with pytest.raises(NoCapacity) as e:
        plan_from_run(str(tmp_path))
    assert e.value.status == status and e.value.exit_code == exit_code
    first = e.value.message.splitlines()[0]
    assert first.startswith(f"{tmp_path}: no capacity to plan for: {says}")
    if launched:
        assert "the knee search said: p99 TPOT 1 ms is below" in first
    # and the floor this hardware breaks, from the workload's own lengths
    assert "p99 TPOT 1 ms is below the single-stream floor" in e.value.message
    assert "(floors at the workload's 40 requests)" in e.value.message
    # a rate given by hand stands in for the missing measurement
    assert plan_from_run(str(tmp_path), rate_per_instance=2.0).feasible is False  # the SLO is still impossible
