"""The sim-http engine end to end (launcher, HTTP replay, /metrics, stop), and `EngineCore.abort`.

The engine tests launch real subprocesses through the shared launcher. The abort tests run the engine core
in-process: abort is what the HTTP server calls on a client disconnect, and a bookkeeping slip there would
leak KV blocks for the rest of a server's life, which no single HTTP test would notice.
"""

from __future__ import annotations

import statistics

import pytest

from tuner.engine.base import LaunchFailure
from tuner.engine.launcher import port_is_free
from tuner.engine.sim import SimEngine
from tuner.engine.sim_http import SimHTTPEngine
from tuner.knobs import Knobs
from tuner.profiles.gpus import get_gpu
from tuner.profiles.models import get_model
from tuner.sim.config import resolve
from tuner.sim.engine import EngineCore, Seq
from tuner.workload.model import WorkloadRequest

GPU, MODEL = "rtx4090", "Qwen/Qwen2.5-7B-Instruct"


# --- EngineCore.abort ---------------------------------------------------------------------------------
def _core(**knobs) -> EngineCore:
    return EngineCore(resolve(get_gpu(GPU), get_model(MODEL), Knobs(max_model_len=4096, **knobs)))


def _assert_empty(core: EngineCore) -> None:
    assert not core.running and not core.waiting and not core.prefilling
    assert core.n_dec == 0 and core.dec_ctx == 0 and not any(core.phase)
    assert core.pool.num_free == core.pool.num_blocks and core.pool.usage == 0
    # no request holds a block: what `cached_used` still counts lies in free pieces (one reference each)
    assert all(core.pool.in_piece.get(h) in core.pool.pieces and not core.pool.pieces[core.pool.in_piece[h]][0]
               for h in core.pool.cached_used)


def test_abort_waiting_prefilling_and_decoding_returns_every_block():
    core = _core(max_num_seqs=2, max_num_batched_tokens=256)
    hashes = list(range(1000, 1040))  # 40 distinct blocks (640 tokens)
    seqs = [Seq(rid=i, arrival=0.0, prompt_len=n, output_len=500, hashes=[h + 100 * i for h in hashes])
            for i, n in enumerate((700, 3000, 700))]
    for s in seqs:
        core.add(s)
    now = 0.0
    while not any(s.decoding for s in seqs):  # seq 0 decodes, seq 1 is mid-prefill, seq 2 waits
        dur, _ = core.step(now)
        now += dur
    for _ in range(10):  # decode across a block boundary (704) while seq 1's long prefill goes on
        dur, _ = core.step(now)
        now += dur
    decoding = [s for s in seqs if s.decoding]
    prefilling = [s for s in seqs if s in core.prefilling]
    assert decoding and prefilling and core.num_waiting == 1
    produced_before = decoding[0].produced
    assert core.abort(core.waiting[0]) and core.num_waiting == 0
    assert core.abort(prefilling[0])
    assert core.abort(decoding[0])
    assert decoding[0].produced > produced_before  # its streamed tokens are credited
    _assert_empty(core)
    assert not core.abort(decoding[0])  # twice is a no-op
    # the aborted request's pending finish must not fire later, and the engine keeps serving
    fresh = Seq(rid=9, arrival=now, prompt_len=100, output_len=5, hashes=[])
    core.add(fresh)
    finished = []
    while core.has_work():
        dur, done = core.step(now)
        finished += done
        now += dur
    assert finished == [fresh]
    _assert_empty(core)


def test_abort_of_a_finished_request_is_refused():
    core = _core()
    seq = Seq(rid=0, arrival=0.0, prompt_len=10, output_len=1, hashes=[])
    core.add(seq)
    _, done = core.step(0.0)
    assert done == [seq]
    assert core.abort(seq) is False
    _assert_empty(core)


def test_abort_keeps_a_shared_prefix_cached_for_the_other_user():
    core = _core()
    shared = [7, 8, 9, 10]
    a = Seq(rid=0, arrival=0.0, prompt_len=80, output_len=50, hashes=shared)
    b = Seq(rid=1, arrival=0.0, prompt_len=80, output_len=50, hashes=shared)
    core.add(a)
    dur, _ = core.step(0.0)
    core.add(b)
    core.step(dur)
    assert b.cached_tokens == 64  # b reused a's four prompt blocks
    core.abort(a)
    assert all(h in core.pool.cached_used for h in shared)  # b still holds them
    core.abort(b)
    _assert_empty(core)
    assert all(h in core.pool.cached_free for h in shared)  # cached for the next request


# --- SimHTTPEngine ------------------------------------------------------------------------------------
K = 2.0


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return SimHTTPEngine(GPU, MODEL, time_scale=K, run_dir=tmp_path_factory.mktemp("sim-http"),
                         api_key="k3y", startup_timeout_s=30)


def test_launch_load_and_stop_agree_with_the_in_process_engine(engine):
    knobs = Knobs(max_model_len=4096, max_num_seqs=16)
    reqs = [WorkloadRequest(prompt_tokens=300 + 20 * (i % 5), output_tokens=16) for i in range(24)]
    times = [i * 0.02 for i in range(24)]  # 50 req/s of simulated time
    virtual = SimEngine(GPU, MODEL).launch(knobs).run_load(reqs, times, offered_rate=50)

    server = engine.launch(knobs)
    try:
        assert server.info.kv_cache_tokens == resolve(get_gpu(GPU), get_model(MODEL), knobs).kv_cache_tokens
        assert "k3y" not in " ".join(server.process.argv)  # the key travels in the environment
        run = server.run_load(reqs, times, offered_rate=50)
    finally:
        server.stop()
    assert port_is_free("127.0.0.1", server.process.port)
    assert server.process.poll() is not None

    assert run.engine == "sim-http" and run.time_scale == K
    assert all(r.ok for r in run.records), [r.error for r in run.records if not r.ok]
    assert [r.output_tokens for r in run.records] == [16] * 24
    assert run.metrics.counter("generation_tokens") == 16 * 24
    assert run.metrics.counter("request_success") == 24

    def medians(load):
        ok = [r for r in load.records if r.ok]
        return (statistics.median(r.first_token_s - r.sent_s for r in ok),
                statistics.median((r.finish_s - r.first_token_s) / (r.output_tokens - 1) for r in ok))

    (ttft_h, tpot_h), (ttft_v, tpot_v) = medians(run), medians(virtual)
    # same engine core, two clocks: HTTP adds a few ms of real overhead (divided by K) and its arrivals
    # fall at slightly different points of the step grid, so batches differ a little
    assert ttft_h == pytest.approx(ttft_v, rel=0.15, abs=0.01), (ttft_h, ttft_v)
    assert tpot_h == pytest.approx(tpot_v, rel=0.15), (tpot_h, tpot_v)


@pytest.mark.parametrize("knobs, kind, text", [
    (Knobs.model_construct(kv_cache_dtype="fp9"), "bad_flag", "invalid choice: 'fp9'"),  # past the tool's own check
    (Knobs(gpu_memory_utilization=0.05), "no_cache_blocks", "No available memory for the cache blocks"),
    (Knobs(gpu_memory_utilization=0.7), "max_model_len", "max seq len (32768)"),
    (Knobs(gpu_memory_utilization=0.99), "memory_utilization", "Free memory on device"),
])
def test_failed_launches_are_classified_from_the_log(engine, knobs, kind, text):
    with pytest.raises(LaunchFailure) as info:
        engine.launch(knobs)
    assert info.value.kind == kind
    assert text in info.value.message + info.value.log_tail
