"""Scheduler invariants of the simulated vLLM V1 engine."""

import numpy as np

from tuner.knobs import Knobs
from tuner.profiles.gpus import get_gpu
from tuner.profiles.models import get_model
from tuner.sim.config import resolve
from tuner.sim.engine import EngineCore, Seq
from tuner.engine.virtual import SimRequest, run_virtual


def mixed(n=600, rate=20.0, seed=3, shared=True):
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1 / rate, n))
    pin = np.clip(rng.lognormal(np.log(600), 0.8, n), 8, 3500).astype(int)
    pout = np.clip(rng.lognormal(np.log(200), 0.8, n), 1, 1500).astype(int)
    out = []
    for i, (a, p, o) in enumerate(zip(arr, pin, pout)):
        hashes = [hash((0, b)) for b in range(min(20, p // 16))] if shared and i % 2 else []
        out.append(SimRequest(float(a), int(p), int(o), hashes))
    return out


def small_cfg(**kw):
    return resolve(get_gpu("rtx4090"), get_model("qwen2.5-7b"),
                   Knobs(max_model_len=4096, gpu_memory_utilization=0.75, **kw))


def test_every_request_finishes_with_its_tokens_and_blocks_come_back():
    cfg = small_cfg(max_num_seqs=64)
    reqs = mixed()
    run = run_virtual(cfg, reqs)
    assert run.metrics.counters["num_preemptions"] > 0  # the pool is small enough to preempt
    for r, rec in zip(reqs, run.records):
        assert rec.error is None
        assert rec.output_tokens == r.output_len
        assert len(rec.token_times) == r.output_len
        assert rec.first_token_s == rec.token_times[0]
        assert rec.finish_s == rec.token_times[-1]
        assert all(b >= a for a, b in zip(rec.token_times, rec.token_times[1:]))
    pool = run.engine.pool
    assert pool.num_free == pool.num_blocks  # nothing leaked, cached blocks are free-but-cached
    # no request holds a block: what `cached_used` still counts lies in free pieces (one reference each)
    assert all(pool.in_piece.get(h) in pool.pieces and not pool.pieces[pool.in_piece[h]][0]
               for h in pool.cached_used)


def test_caps_are_never_exceeded():
    cfg = small_cfg(max_num_seqs=16, max_num_batched_tokens=512)
    core = EngineCore(cfg)
    for i, r in enumerate(mixed(300, 50.0)):
        core.add(Seq(rid=i, arrival=0.0, prompt_len=r.prompt_len, output_len=r.output_len,
                     hashes=list(r.hashes)))
    now = 0.0
    while core.has_work():
        dur, _ = core.step(now)
        now += dur
        assert core.num_running <= 16
        assert core.last_step_tokens <= 512
        assert 0 <= core.pool.num_free <= core.pool.num_blocks


def test_deterministic_for_a_seed_and_noise_changes_timing():
    cfg = small_cfg()
    reqs = mixed(200)
    a = run_virtual(cfg, reqs, noise=0.03, seed=7)
    b = run_virtual(cfg, reqs, noise=0.03, seed=7)
    c = run_virtual(cfg, reqs, noise=0.03, seed=8)
    assert [r.finish_s for r in a.records] == [r.finish_s for r in b.records]
    assert [r.finish_s for r in a.records] != [r.finish_s for r in c.records]


def test_too_long_request_is_rejected_like_vllm():
    cfg = small_cfg()
    run = run_virtual(cfg, [SimRequest(0.0, 4000, 200), SimRequest(0.0, 100, 10)])
    assert "maximum context length is 4096 tokens" in run.records[0].error
    assert run.records[1].error is None


def test_overload_times_out_instead_of_running_forever():
    cfg = small_cfg()
    reqs = [SimRequest(i * 0.001, 2000, 500) for i in range(3000)]
    run = run_virtual(cfg, reqs, request_timeout_s=30.0, token_times=False)
    errs = sum(r.error == "timeout" for r in run.records)
    assert errs > 1000
    assert run.duration_s < 40
