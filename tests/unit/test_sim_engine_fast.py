"""The simulator's fast paths change no number: fused decode steps (`tuner.sim.fused.decode_steps`, across
finishes, saturated waits and gauge samples) against one `step` call a step, and the inlined decode cost
against `CostModel.step_time`."""

from __future__ import annotations

import random

import numpy as np
import pytest

import tuner.engine.virtual as virtual
from tuner.engine.virtual import SimRequest, run_virtual
from tuner.knobs import Knobs
from tuner.profiles.gpus import get_gpu
from tuner.profiles.models import get_model
from tuner.sim.config import resolve
from tuner.sim.costs import CostModel, CostParams
from tuner.tokens import block_hashes_from_ids


def _requests(n: int, rate: float, seed: int, shared: int = 8) -> list[SimRequest]:
    """Chat-like requests: a shared system prompt (the first `shared` blocks) and a private tail."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n)) if rate < 1e5 else np.zeros(n)
    out = []
    for i, a in enumerate(arrivals):
        p = int(np.clip(rng.lognormal(np.log(400), 0.5), 20, 3000))
        ids = list(range(shared)) + [10_000 + 100 * i + k for k in range(p // 16 - shared)]
        out.append(SimRequest(float(a), p, int(np.clip(rng.lognormal(np.log(150), 0.6), 2, 1500)),
                              block_hashes_from_ids(ids, 16, p, unique=i)))
    return out


def _dump(run) -> tuple:
    recs = [r.model_dump() for r in run.records]
    return recs, run.metrics.model_dump(), run.duration_s, run.steps


@pytest.mark.parametrize("knobs,rate", [
    (Knobs(), 6.0),                                   # below capacity: finishes between arrivals
    (Knobs(), 1e6),                                   # a burst: a saturated engine, a long drain
    (Knobs(max_num_seqs=16), 12.0),                   # running full while requests wait
    (Knobs(gpu_memory_utilization=0.72), 12.0),       # KV-bound: preemptions
    (Knobs(enable_prefix_caching=False, max_num_batched_tokens=1024), 9.0),
])
def test_fused_decode_steps_give_the_step_by_step_numbers(monkeypatch, knobs, rate):
    cfg = resolve(get_gpu("rtx4090"), get_model("qwen2.5-7b"), knobs)
    reqs = _requests(300, rate, seed=3)
    kw = dict(request_timeout_s=60.0, sample_interval_s=0.05, warmup_s=2.0, cooldown_s=1.0)
    fused = _dump(run_virtual(cfg, reqs, **kw))
    monkeypatch.setattr(virtual, "FUSED_DECODE", False)
    reference = _dump(run_virtual(cfg, reqs, **kw))
    assert fused == reference
    assert fused[1]["counters"]["request_success"] > 0  # the run did something


def test_the_inlined_decode_cost_is_step_time_to_the_last_bit():
    rng = random.Random(0)
    for gpu, model, knobs, params in [
        ("rtx4090", "qwen2.5-7b", Knobs(), None),
        ("h100", "llama-3.1-8b", Knobs(tensor_parallel_size=2), None),
        ("a100", "qwen2.5-7b", Knobs(), CostParams(attn_superlinear=0.3, per_request_s=0.002)),
    ]:
        cost = CostModel(resolve(get_gpu(gpu), get_model(model), knobs), params)
        for _ in range(2000):
            n = rng.randint(1, 1024)
            ctx = rng.randint(n, 4_000_000)
            fixed, attn_pp, kv_pp, factor, ar = cost.decode_terms(n)
            dc, dm = ctx * attn_pp, ctx * kv_pp
            dec = dc if dc > dm else dm
            if factor:
                dec *= factor
            t = fixed + dec
            if ar:
                t += ar
            assert t == cost.step_time(0, 0.0, 0, n, ctx, n, 1)
