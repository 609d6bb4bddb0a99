"""Knob directions: each knob helps or hurts in the simulator for the reason it does on a GPU."""

import statistics

import numpy as np
import pytest

from tuner.knobs import Knobs
from tuner.profiles.gpus import get_gpu
from tuner.profiles.models import get_model
from tuner.sim.config import resolve
from tuner.tokens import block_hashes_from_ids
from tuner.engine.virtual import SimRequest, run_virtual

GPU, MODEL = get_gpu("rtx4090"), get_model("qwen2.5-7b")


def poisson(n, rate, pin, pout, seed=0):
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1 / rate, n))
    return [SimRequest(float(a), pin, pout) for a in arr]


def run(knobs, reqs, model=MODEL):
    return run_virtual(resolve(GPU, model, knobs), reqs)


def med(values):
    return statistics.median(values)


def test_larger_batched_tokens_lowers_ttft_and_raises_tpot_under_prefill_heavy_load():
    """Bigger prefill chunks finish prompts in fewer steps (TTFT down) but the decodes that share those
    steps stall behind them (p99 TPOT and ITL up): vLLM's documented trade-off."""
    reqs = poisson(400, 2.0, 1500, 200)
    small = run(Knobs(max_model_len=8192, max_num_batched_tokens=512), reqs)
    large = run(Knobs(max_model_len=8192, max_num_batched_tokens=2048), reqs)
    assert med(r.ttft for r in large.records) < 0.8 * med(r.ttft for r in small.records)
    p99 = lambda xs: float(np.percentile(list(xs), 99))  # noqa: E731
    assert p99(r.tpot for r in large.records) > 1.03 * p99(r.tpot for r in small.records)
    assert p99(i for r in large.records for i in r.itls) > 2 * p99(i for r in small.records for i in r.itls)


def throughput(r):
    return sum(x.output_tokens for x in r.records) / r.duration_s


def test_more_seqs_raise_throughput_until_kv_binds():
    reqs = [SimRequest(0.0, 512, 256) for _ in range(1500)]
    res = {n: run(Knobs(max_model_len=4096, max_num_seqs=n), reqs) for n in (8, 32, 128, 512)}
    tp = {n: throughput(r) for n, r in res.items()}
    assert tp[8] < tp[32] < tp[128]
    # at 512 the KV pool (about 130k tokens / 768 per sequence ~ 170 sequences) binds, not the cap:
    peak_running = max(s.running for s in res[512].metrics.samples)
    assert peak_running < 512
    assert max(s.kv_usage for s in res[512].metrics.samples) > 0.95
    assert tp[512] < 1.25 * tp[128]


def test_lower_memory_utilization_brings_preemptions_and_lower_capacity():
    reqs = [SimRequest(0.0, 1024, 512) for _ in range(800)]
    hi = run(Knobs(max_model_len=4096, gpu_memory_utilization=0.92), reqs)
    lo = run(Knobs(max_model_len=4096, gpu_memory_utilization=0.75), reqs)
    assert lo.metrics.counters["num_preemptions"] > hi.metrics.counters["num_preemptions"]
    assert throughput(lo) < 0.9 * throughput(hi)


def test_fp8_kv_doubles_kv_tokens_and_helps_when_kv_binds():
    reqs = [SimRequest(0.0, 1024, 512) for _ in range(800)]
    auto = run(Knobs(max_model_len=4096), reqs)
    fp8 = run(Knobs(max_model_len=4096, kv_cache_dtype="fp8"), reqs)
    assert fp8.engine.cfg.kv_cache_tokens == pytest.approx(2 * auto.engine.cfg.kv_cache_tokens, rel=0.01)
    assert max(s.running for s in fp8.metrics.samples) > 1.5 * max(s.running for s in auto.metrics.samples)
    assert throughput(fp8) > throughput(auto)


def shared_prompt_workload(n=400, rate=2.0, shared_frac=0.8, sys_blocks=64, unique=256, seed=1):
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1 / rate, n))
    out = []
    for i, a in enumerate(arr):
        shared = rng.random() < shared_frac
        plen = sys_blocks * 16 + unique
        ids = list(range(sys_blocks)) if shared else []
        out.append(SimRequest(float(a), plen, 64, block_hashes_from_ids(ids, 16, plen, unique=i)))
    return out, sum(1 for r in out if r.hashes and len(r.hashes) and r.hashes[0] == out[0].hashes[0])


def test_prefix_caching_cuts_ttft_and_hit_rate_matches_shared_fraction():
    reqs, _ = shared_prompt_workload()
    shared = [r for r in reqs if block_hashes_from_ids(list(range(64)), 16, 1280, 0)[0] == r.hashes[0]]
    on = run(Knobs(max_model_len=8192), reqs)
    off = run(Knobs(max_model_len=8192, enable_prefix_caching=False), reqs)
    assert med(r.ttft for r in on.records) < 0.6 * med(r.ttft for r in off.records)
    c = on.metrics.counters
    hit_rate = c["prefix_cache_hits"] / c["prefix_cache_queries"]
    expected = (len(shared) - 1) * 1024 / sum(r.prompt_len for r in reqs)
    assert hit_rate == pytest.approx(expected, abs=0.01)
    assert off.metrics.counters["prefix_cache_hits"] == 0


def test_awq_lowers_tpot_at_light_load():
    reqs = poisson(100, 0.5, 256, 128)
    bf16 = run(Knobs(max_model_len=4096), reqs)
    awq = run(Knobs(max_model_len=4096), reqs, model=get_model("qwen2.5-7b-awq"))
    assert med(r.tpot for r in awq.records) < 0.6 * med(r.tpot for r in bf16.records)


# -- enable_chunked_prefill ---------------------------------------------------------------------------------

def test_unchunked_prefill_needs_a_token_budget_of_one_whole_request():
    """vLLM 0.32 with --no-enable-chunked-prefill: the default budget becomes max_model_len, and a smaller
    one is refused at start-up with vLLM's SchedulerConfig message."""
    from tuner.failures import LaunchFailure

    assert resolve(GPU, MODEL, Knobs(max_model_len=4096)).enable_chunked_prefill is True  # vLLM's default
    assert resolve(GPU, MODEL, Knobs(max_model_len=4096)).max_num_batched_tokens == 2048
    off = resolve(GPU, MODEL, Knobs(max_model_len=4096, enable_chunked_prefill=False))
    assert not off.enable_chunked_prefill and off.max_num_batched_tokens == 4096
    with pytest.raises(LaunchFailure) as e:
        resolve(GPU, MODEL, Knobs(max_model_len=4096, max_num_batched_tokens=2048, enable_chunked_prefill=False))
    assert e.value.kind == "bad_flag" and "max_num_batched_tokens (2048) is smaller than max_model_len (4096)" \
        in e.value.message


def _prefills_left_partial(chunked: bool) -> int:
    """Steps after which some prompt was only partly prefilled, on a stream of 3,000-token prompts."""
    from tuner.sim.engine import EngineCore, Seq

    cfg = resolve(GPU, MODEL, Knobs(max_model_len=4096, max_num_batched_tokens=4096, max_num_seqs=64,
                                    enable_chunked_prefill=chunked))
    core = EngineCore(cfg)
    for i in range(40):
        core.add(Seq(rid=i, arrival=0.0, prompt_len=3000, output_len=50, hashes=[]))
    now, partial = 0.0, 0
    while core.has_work():
        dur, _ = core.step(now)
        now += dur
        assert core.last_step_tokens <= 4096
        partial += any(0 < s.computed < s.target for s in core.prefilling)
    return partial


def test_without_chunked_prefill_a_prompt_is_scheduled_whole():
    """Chunked, the budget left after a step's first prompt takes a chunk of the next one; unchunked, the
    next prompt waits for a step with room for all of it (vLLM V1's scheduler stops admitting there)."""
    assert _prefills_left_partial(chunked=True) > 0
    assert _prefills_left_partial(chunked=False) == 0


def test_the_chunked_prefill_knob_is_spelled_and_parsed_as_vllm_does():
    from tuner.knobs import vllm_defaults
    from tuner.cli.sim import _knobs, build_parser

    assert Knobs(enable_chunked_prefill=False).flags() == ["--no-enable-chunked-prefill"]
    assert vllm_defaults(GPU)["enable_chunked_prefill"] is True
    args = build_parser().parse_args(["--gpu", "-", "--model", "-", "--no-enable-chunked-prefill"])
    assert _knobs(args) == Knobs(enable_chunked_prefill=False)
