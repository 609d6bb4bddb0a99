"""`PrometheusSource` against a fake Prometheus HTTP API on 127.0.0.1 (tests/helpers/fake_prometheus.py).
The real-Prometheus check is tests/integration/test_replay_prometheus.py (slow)."""

import math

import pytest

from tests.helpers.fake_prometheus import Data, FakePrometheus
from tuner.metrics.parse import ITL, TTFT
from tuner.metrics.prometheus import PrometheusSource
from tuner.metrics.scrape import histogram_quantile
from tuner.metrics.window import PREEMPTIONS, PREFIX_HITS, PREFIX_QUERIES, REQUEST_SUCCESS
from tuner.replay.record import LoadRun

T0 = 1_800_000_000.25


def _new_names() -> Data:
    return Data(
        gauges={"vllm:num_requests_running": 8.0, "vllm:num_requests_waiting": 3.0,
                "vllm:kv_cache_usage_perc": 0.5},
        increases={"vllm:num_preemptions_total": 4.0, "vllm:prefix_cache_queries_total": 1000.0,
                   "vllm:prefix_cache_hits_total": 250.0, "vllm:request_success_total": 20.0,
                   "vllm:time_to_first_token_seconds_sum": 2.0,
                   "vllm:time_to_first_token_seconds_count": 20.0},
        buckets={"vllm:time_to_first_token_seconds_bucket": {"0.05": 5.0, "0.1": 15.0, "0.2": 20.0,
                                                             "+Inf": 20.0}},
        info={"vllm:cache_config_info": {"block_size": "16", "num_gpu_blocks": "900", "engine": "0",
                                         "model_name": "m", "job": "vllm", "instance": "h:8000"}})


def test_window_from_prometheus_matches_the_canned_series():
    with FakePrometheus(_new_names(), selector_required='job="vllm"') as fake:
        src = PrometheusSource(fake.url, selector='job="vllm"')
        w = src.window(T0, T0 + 10.0, step_s=2.0, t0_unix=T0)
    assert [s.t for s in w.samples] == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert all(s.running == 8 and s.waiting == 3 and s.kv_usage == 0.5 for s in w.samples)
    assert w.counter(PREEMPTIONS) == 4 and w.counter(REQUEST_SUCCESS) == 20
    assert w.counter(PREFIX_HITS) / w.counter(PREFIX_QUERIES) == 0.25
    h = w.histograms[TTFT]
    assert h.buckets == {0.05: 5.0, 0.1: 15.0, 0.2: 20.0, math.inf: 20.0} and h.count == 20 and h.sum == 2
    assert histogram_quantile(h, 0.5) == pytest.approx(0.075)
    assert w.cache_config == {"block_size": "16", "num_gpu_blocks": "900"}
    # The queries: selector on every series, ranges exactly the window, sub-second start/end kept.
    qs = [q["query"] for q in fake.queries]
    assert all('{job="vllm"}' in q for q in qs)
    assert any("increase(vllm:num_preemptions_total{job=\"vllm\"}[10000ms])" in q for q in qs)
    ranges = [q for q in fake.queries if q["path"] == "/api/v1/query_range"]
    assert len(ranges) == 3 and all(q["start"] == f"{T0:.3f}" and q["step"] == "2" for q in ranges)
    instants = [q for q in fake.queries if q["path"] == "/api/v1/query"]
    assert all(float(q["time"]) == T0 + 10.0 for q in instants)


def test_old_vllm_names_through_or():
    data = Data(gauges={"vllm:num_requests_running": 1.0, "vllm:num_requests_waiting": 0.0,
                        "vllm:gpu_cache_usage_perc": 0.9},
                increases={"vllm:gpu_prefix_cache_queries_total": 100.0,
                           "vllm:gpu_prefix_cache_hits_total": 40.0,
                           "vllm:time_per_output_token_seconds_count": 7.0},
                buckets={"vllm:time_per_output_token_seconds_bucket": {"0.025": 3.0, "+Inf": 7.0}})
    with FakePrometheus(data) as fake:
        w = PrometheusSource(fake.url).window(T0, T0 + 4.0, step_s=1.0)
    assert [s.kv_usage for s in w.samples] == [0.9] * 5
    assert w.counter(PREFIX_QUERIES) == 100 and w.counter(PREFIX_HITS) == 40
    assert w.histograms[ITL].count == 7 and w.histograms[ITL].buckets[0.025] == 3
    assert TTFT not in w.histograms  # no series, no made-up histogram
    assert w.counter(PREEMPTIONS) == 0


def test_window_for_run_uses_the_runs_clock_and_scale():
    run = LoadRun(offered_rate=1.0, duration_s=3.0, records=[], started_unix=T0, time_scale=2.0)
    with FakePrometheus(_new_names()) as fake:
        w = PrometheusSource(fake.url).window_for_run(run, step_s=1.0)
    # 3 s of server time at scale 2 is 6 real seconds; sample times are back in server seconds.
    assert [s.t for s in w.samples] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    assert any("[6000ms]" in q["query"] for q in fake.queries)
    with pytest.raises(ValueError):
        PrometheusSource(fake.url).window_for_run(run.model_copy(update={"started_unix": None}))
    with pytest.raises(ValueError):
        PrometheusSource(fake.url).window(T0, T0)


def test_unreachable_prometheus_raises():
    src = PrometheusSource("http://127.0.0.1:9", timeout_s=2, retries=0)
    with pytest.raises(Exception):
        src.window(T0, T0 + 1.0)
