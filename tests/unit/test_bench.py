"""`tune bench`'s statistics (vLLM `bench serve`'s definitions) and the closed loop of the in-process engine."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tuner.engine.sim import SimEngine
from tuner.knobs import Knobs
from tuner.bench.result import (assign_adapters, bench_result, bench_schedule, format_table, max_in_flight,
                                run_span)
from tuner.errors import UserError
from tuner.replay.record import LoadRun, RequestRecord
from tuner.slo import SLO
from tuner.workload.model import Workload, WorkloadRequest


def rec(i: int, sent: float, tokens: list[float], *, error: str | None = None, prompt: int = 10) -> RequestRecord:
    """A finished request whose tokens arrived at `tokens` (run seconds); [DONE] with the last one."""
    r = RequestRecord(index=i, scheduled_s=sent, sent_s=sent, prompt_tokens=prompt,
                      expected_output_tokens=len(tokens), output_tokens=len(tokens), token_times=tokens,
                      first_token_s=tokens[0] if tokens else None, error=error)
    if error is None:
        r.finish_s = r.end_s = tokens[-1]
    else:
        r.end_s = sent + 0.5
    return r


def run_of(records: list[RequestRecord]) -> LoadRun:
    return LoadRun(offered_rate=1.0, duration_s=10.0, records=records)


def test_bench_statistics_follow_vllm_definitions():
    a = rec(0, 0.0, [0.1, 0.2, 0.4])        # ttft 0.1, tpot (0.4-0.1)/2 = 0.15, gaps 0.1 0.2, e2el 0.4
    b = rec(1, 1.0, [1.3])                  # one token: no TPOT, no gap; ttft = e2el = 0.3
    c = rec(2, 2.0, [], error="HTTP 500: boom")
    res = bench_result(run_of([a, b, c]), rate=2.0, burstiness=1.0, max_concurrency=None, model="m",
                       api="completions", percentiles=[50, 99.9])
    assert (res.completed, res.failed) == (2, 1)
    assert res.duration == pytest.approx(2.5)  # first send 0.0 to the failure's end 2.5
    assert res.total_input_tokens == 20 and res.total_output_tokens == 4
    assert res.request_throughput == pytest.approx(2 / 2.5)
    assert res.total_token_throughput == pytest.approx(24 / 2.5)
    assert res.mean_ttft_ms == pytest.approx(200.0)
    assert res.mean_tpot_ms == pytest.approx(150.0)            # b left out
    assert res.mean_itl_ms == pytest.approx(150.0)             # gaps 100 and 200 pooled
    assert res.mean_e2el_ms == pytest.approx(350.0)
    extra = res.model_extra or {}
    assert extra["p50_ttft_ms"] == pytest.approx(200.0) and "p99.9_e2el_ms" in extra
    assert res.request_goodput is None and res.errors == ["HTTP 500: boom"]
    table = format_table(res, [50, 99.9])
    assert "Request rate configured (RPS):           2.00" in table
    assert "P99.9 E2EL (ms):" in table and "Maximum request concurrency" not in table


def test_goodput_counts_requests_good_on_every_threshold():
    fast = rec(0, 0.0, [0.05, 0.06, 0.07])
    slow = rec(1, 0.0, [0.5, 0.6, 0.7])
    slo = SLO(ttft={"max_ms": 100})
    res = bench_result(run_of([fast, slow]), rate=math.inf, burstiness=1.0, max_concurrency=2, model=None,
                       api="chat", slo=slo)
    assert res.request_goodput == pytest.approx(1 / 0.7) and res.request_rate == "inf"
    assert res.backend == "openai-chat"


def test_max_in_flight_and_span():
    recs = [rec(0, 0.0, [1.0]), rec(1, 1.0, [2.0]), rec(2, 0.5, [1.5])]
    assert max_in_flight(recs) == 2  # the one ending at 1.0 frees its slot before the send at 1.0
    assert run_span(recs) == pytest.approx(2.0)
    assert max_in_flight([]) == 0 and run_span([]) == 0.0


def test_bench_schedule_cycles_and_keeps_trace_times():
    reqs = [WorkloadRequest(prompt_tokens=5 + i, output_tokens=3, arrival_s=2.0 * i) for i in range(4)]
    wl = Workload(name="t", source_format="mooncake", requests=reqs)
    chosen, times = bench_schedule(wl, 6, math.inf)
    assert [r.prompt_tokens for r in chosen] == [5, 6, 7, 8, 5, 6] and times == [0.0] * 6
    _, times = bench_schedule(wl, 3, math.inf, "trace")
    assert times == [0.0, 2.0, 4.0]
    _, times = bench_schedule(wl, 3, 1.0, "trace")  # rescaled: 2 gaps in 2 s
    assert times == pytest.approx([0.0, 1.0, 2.0])
    _, times = bench_schedule(wl, 40, 5.0, "poisson", seed=3)
    assert times[0] == 0.0 and all(b >= a for a, b in zip(times, times[1:]))


def test_adapters_are_assigned_as_vllm_bench_serve_assigns_them():
    reqs = [WorkloadRequest(prompt_tokens=5, output_tokens=3, lora="own" if i == 0 else None) for i in range(7)]
    rr = assign_adapters(reqs, ["a", "b", "c"], "round-robin")
    assert [r.lora for r in rr] == ["a", "b", "c", "a", "b", "c", "a"]  # request i: adapters[i % n]
    assert reqs[0].lora == "own"  # the workload's requests are not changed
    many = assign_adapters([reqs[1]] * 3000, ["a", "b", "c"], "random", seed=4)
    counts = {n: sum(r.lora == n for r in many) for n in "abc"}
    assert all(900 < c < 1100 for c in counts.values()), counts  # uniform
    assert [r.lora for r in assign_adapters(reqs, ["a", "b"], "random", seed=4)] == \
        [r.lora for r in assign_adapters(reqs, ["a", "b"], "random", seed=4)]
    assert assign_adapters(reqs, [], "random") == reqs  # no --lora-modules: each request's own
    with pytest.raises(UserError, match="--lora-assignment"):
        assign_adapters(reqs, ["a"], "zipf")


def test_in_process_closed_loop_caps_the_engine():
    """The in-process engine's closed loop: never more than C in the engine, and the queue moves to
    the client (TTFT falls, the run lengthens) compared with the same burst open loop."""
    server = SimEngine("h100-sxm", "Qwen/Qwen2.5-7B-Instruct").launch(Knobs())
    reqs = [WorkloadRequest(prompt_tokens=200, output_tokens=20) for _ in range(40)]
    open_run = server.run_load(reqs, [0.0] * 40, offered_rate=0.0)
    closed = server.run_load(reqs, [0.0] * 40, offered_rate=0.0, max_concurrency=4)
    assert max_in_flight(open_run.records) == 40 and max_in_flight(closed.records) == 4
    assert all(r.ok for r in closed.records)
    assert all(r.sent_s >= r.scheduled_s for r in closed.records)
    mean = lambda run: np.mean([r.ttft for r in run.records])  # noqa: E731
    assert mean(closed) < mean(open_run) and closed.duration_s > open_run.duration_s


def test_gate_load_takes_max_concurrency_as_a_strict_integer():
    from tuner.errors import UserError
    from tuner.gate import load_settings

    assert load_settings({"max_concurrency": 4}).max_concurrency == 4
    assert load_settings({}).max_concurrency is None  # open loop by default
    for bad in ("4", True, 0, 2.5):
        with pytest.raises(UserError, match="load.max_concurrency"):
            load_settings({"max_concurrency": bad}, "gate.yaml")
