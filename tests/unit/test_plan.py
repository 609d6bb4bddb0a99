"""Capacity plan arithmetic against REFERENCE.md section 1, the profiles and `resolve`."""

from __future__ import annotations

import math

import pytest

from tuner.errors import UserError
from tuner.knobs import Knobs
from tuner.plan import HOURS_PER_MONTH, feasibility, format_plan, make_plan, memory_gate
from tuner.profiles.gpus import get_gpu
from tuner.profiles.models import get_model
from tuner.sim.config import resolve
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


def test_an_exact_quotient_is_not_rounded_up_by_float_error():
    # 7 / (0.7 x 10) is 1.0000000000000002 in floating point: still one instance
    assert make_plan(rate_per_instance=10, peak_rate=7, headroom=0.7).instances == 1


def test_decode_floor_matches_the_reference_and_the_simulator():
    f = feasibility(get_gpu(GPU), QWEN, SLO(tpot=50))
    assert f.tpot_floor_ms == pytest.approx(21.5, abs=0.2)     # 15.2 GB / (0.7 x 1008 GB/s)
    from tuner.sim.costs import CostModel

    floor_sim = CostModel(resolve(get_gpu(GPU), get_model(QWEN), Knobs())).decode_floor() * 1000
    assert f.tpot_floor_ms == pytest.approx(floor_sim, rel=1e-9)
    assert f.feasible


def test_an_slo_below_the_decode_floor_is_infeasible_not_a_number():
    p = make_plan(rate_per_instance=7.8, peak_rate=50, gpu=GPU, model=QWEN, slo=SLO(tpot=15))
    assert not p.feasible and p.instances is None and p.gpus is None
    text = format_plan(p)
    assert text.startswith("INFEASIBLE") and "below the decode floor" in text
    assert "instances" not in text
    # quantized weights lower the floor below 15 ms: the same SLO becomes feasible (fp8: 8.7 GB)
    q = make_plan(rate_per_instance=7.8, peak_rate=50, gpu=GPU, model=QWEN, slo=SLO(tpot=15),
                  knobs=Knobs(quantization="fp8"))
    assert q.feasible and q.feasibility.tpot_floor_ms < 15


def test_tensor_parallelism_splits_the_floor_and_multiplies_gpus():
    one = feasibility(get_gpu(GPU), QWEN, None)
    two = feasibility(get_gpu(GPU), QWEN, None, tp=2)
    assert two.tpot_floor_ms == pytest.approx(one.tpot_floor_ms / 2)
    p = make_plan(rate_per_instance=7.8125, peak_rate=50, headroom=0.7, tp=2)
    assert p.instances == 10 and p.gpus == 20 and p.gpus_with_spare == 22


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
