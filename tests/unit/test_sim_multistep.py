"""V0's multi-step scheduling in the simulated engine (`tuner.sim.multistep`): tokens reach the client in
bursts, arrivals wait for the burst, and one-step scheduling is left exactly as it was."""

import numpy as np

from tuner.engine.virtual import SimRequest, run_virtual
from tuner.knobs import Knobs
from tuner.profiles.gpus import get_gpu
from tuner.profiles.models import get_model
from tuner.sim.config import resolve
from tuner.sim.engine import EngineCore


def _cfg():
    return resolve(get_gpu("a100"), get_model("llama-3.1-8b"),
                   Knobs(max_model_len=4096, gpu_memory_utilization=0.9, max_num_seqs=256, max_num_batched_tokens=4096))


def _reqs(n=60, rate=4.0, seed=1):
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1 / rate, n))
    return [SimRequest(float(a), int(p), int(o)) for a, p, o in
            zip(arr, rng.integers(50, 600, n), rng.integers(20, 300, n))]


def _run(steps: int, reqs):
    core = EngineCore(_cfg())
    core.multi_step = steps
    return run_virtual(_cfg(), reqs, engine=core).records


def test_tokens_come_in_bursts_and_light_load_ttft_waits_for_the_burst():
    reqs = _reqs()
    one, ten = _run(1, reqs), _run(10, reqs)
    for r, rec in zip(reqs, ten):
        assert rec.error is None and len(rec.token_times) == r.output_len
        assert rec.first_token_s == rec.token_times[0] and rec.finish_s == rec.token_times[-1]
    gaps = lambda recs: [b - a for rec in recs for a, b in zip(rec.token_times, rec.token_times[1:])]  # noqa: E731
    # one-step: every gap is a step; ten-step: most gaps are zero (same burst), the rest about ten steps
    assert np.median(gaps(one)) > 0
    nonzero = [g for g in gaps(ten) if g > 0]
    assert np.mean([g == 0 for g in gaps(ten)]) > 0.8
    assert np.median(nonzero) > 6 * np.median(gaps(one))
    # a request arriving mid-burst waits for its rest: the median TTFT grows by a few steps
    ttft = lambda recs: np.median([rec.first_token_s - rec.sent_s for rec in recs])  # noqa: E731
    assert ttft(ten) > ttft(one) + 2 * np.median(gaps(one))
    # the tokens' total time barely moves (TPOT within 10%)
    tpot = lambda recs: np.median([rec.tpot for rec in recs if rec.output_tokens > 1])  # noqa: E731
    assert abs(tpot(ten) / tpot(one) - 1) < 0.10


def test_one_step_is_the_default_and_unchanged():
    reqs = _reqs(20)
    plain = run_virtual(_cfg(), reqs).records
    explicit = _run(1, reqs)
    assert [r.token_times for r in plain] == [r.token_times for r in explicit]
