import math
from pathlib import Path

import pytest

from tuner.metrics.parse import (ITL, KV_USAGE, RUNNING, SAMPLED_GAUGES, TTFT, WAITING, parse_metrics)
from tuner.metrics.scrape import histogram_quantile, window
from tuner.metrics.window import (PREEMPTIONS, PREFIX_HITS, PREFIX_QUERIES, REQUEST_SUCCESS,
                                  GaugeSample, HistogramDelta, MetricsWindow)

OLD = Path(__file__).resolve().parents[1] / "fixtures" / "metrics" / "vllm_old_names.txt"


def _snap(vllm_fixtures, name, **kw):
    return parse_metrics((vllm_fixtures / f"metrics_{name}.txt").read_text(), **kw)


def test_idle_has_all_families_at_zero(vllm_fixtures):
    s = _snap(vllm_fixtures, "idle")
    assert s.gauges[RUNNING] == 0 and s.gauges[WAITING] == 0 and s.gauges[KV_USAGE] == 0
    assert s.counters[PREEMPTIONS] == 0 and s.counters[PREFIX_QUERIES] == 0
    assert {TTFT, ITL, "e2e_request_latency_seconds", "iteration_tokens_total"} <= set(s.histograms)
    assert s.histograms[TTFT].count == 0
    assert s.cache_config["num_gpu_blocks"] == "64" and s.cache_config["enable_prefix_caching"] == "True"
    # Non-vLLM families (python_gc_*, process_*) are not mixed in.
    assert not any(k.startswith(("python", "process")) for k in s.gauges | s.counters)


def test_batch_cap_bound(vllm_fixtures):
    s = _snap(vllm_fixtures, "batch_cap_bound")
    assert s.gauges[RUNNING] == 8 and s.gauges[WAITING] == 8
    assert s.gauges[KV_USAGE] == pytest.approx(0.30, abs=0.01)
    assert s.counters[PREEMPTIONS] == 0
    assert s.counters[PREFIX_HITS] > 0.5 * s.counters[PREFIX_QUERIES]  # shared prompts hit the cache
    assert s.cache_config["gpu_memory_utilization"] == "0.92"


def test_kv_bound_and_window_delta(vllm_fixtures):
    during = _snap(vllm_fixtures, "kv_bound")
    after = _snap(vllm_fixtures, "after_kv_bound_run")
    assert during.gauges[RUNNING] == 2 and during.gauges[WAITING] == 18 and during.gauges[KV_USAGE] == 1.0
    assert during.counters[PREEMPTIONS] == 28
    assert during.counters[REQUEST_SUCCESS] == 28  # summed over finished_reason
    assert during.cache_config["kv_cache_size_tokens"] == "2048"
    samples = [GaugeSample(t=0.5, running=2, waiting=18, kv_usage=1.0)]
    w = window(during, after, samples)
    assert isinstance(w, MetricsWindow)
    assert w.counter(PREEMPTIONS) == 19
    assert w.counter(REQUEST_SUCCESS) == 20
    assert w.counter(PREFIX_HITS) == 0
    h = w.histograms[TTFT]
    assert h.count == after.histograms[TTFT].count - during.histograms[TTFT].count == 18
    assert h.buckets[math.inf] == h.count
    assert all(b >= 0 for b in h.buckets.values())
    assert list(h.buckets.values()) == sorted(h.buckets.values())  # still cumulative
    assert w.samples == samples


def test_old_names_are_read_as_new(vllm_fixtures):
    old = parse_metrics(OLD.read_text())
    assert old.gauges[KV_USAGE] == pytest.approx(0.7321)
    assert old.gauges[RUNNING] == 12 and old.gauges[WAITING] == 5
    assert old.counters[PREFIX_QUERIES] == 400000 and old.counters[PREFIX_HITS] == 100000
    assert old.counters[PREEMPTIONS] == 7 and old.counters[REQUEST_SUCCESS] == 200
    assert ITL in old.histograms and old.histograms[ITL].count == 51000
    assert "gpu_cache_usage_perc" not in old.gauges and "time_per_output_token_seconds" not in old.histograms
    assert old.cache_config["block_size"] == "16"
    # New names win where a transition release exports both spellings.
    new = (vllm_fixtures / "metrics_kv_bound.txt").read_text()
    both = parse_metrics(new + "\n# TYPE vllm:gpu_cache_usage_perc gauge\n"
                                "vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"tiny\"} 0.5\n")
    assert both.gauges[KV_USAGE] == 1.0


def test_gauge_only_parse_matches_full_parse(vllm_fixtures):
    for name in ("idle", "batch_cap_bound", "kv_bound"):
        text = (vllm_fixtures / f"metrics_{name}.txt").read_text()
        fast = parse_metrics(text, only=SAMPLED_GAUGES)
        full = parse_metrics(text)
        assert set(fast.gauges) == set(SAMPLED_GAUGES)
        assert {k: full.gauges[k] for k in SAMPLED_GAUGES} == fast.gauges
        assert not fast.histograms and not fast.counters
    old = parse_metrics(OLD.read_text(), only=SAMPLED_GAUGES)
    assert old.gauges[KV_USAGE] == pytest.approx(0.7321)


def test_label_sets_are_summed_and_perc_averaged():
    text = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 5.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.6
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 4.0
vllm:num_preemptions_total{engine="1",model_name="m"} 6.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 2.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.3
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="m"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="m"} 3.0
vllm:time_to_first_token_seconds_count{engine="1",model_name="m"} 3.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="m"} 0.15
"""
    s = parse_metrics(text)
    assert s.gauges[RUNNING] == 8
    assert s.gauges[KV_USAGE] == pytest.approx(0.4)
    assert s.counters[PREEMPTIONS] == 10
    h = s.histograms[TTFT]
    assert h.buckets == {0.1: 4.0, math.inf: 5.0} and h.count == 5 and h.sum == pytest.approx(0.45)


def test_counter_reset_counts_from_zero(vllm_fixtures):
    after = _snap(vllm_fixtures, "kv_bound")
    before = _snap(vllm_fixtures, "after_kv_bound_run")  # "before" has larger counters: a restart
    w = window(before, after)
    assert w.counter(PREEMPTIONS) == 28
    assert w.histograms[TTFT].count == after.histograms[TTFT].count


def _h(pairs):
    return HistogramDelta(buckets=dict(pairs), count=pairs[-1][1])


def test_histogram_quantile_like_promql():
    h = _h([(0.1, 10.0), (0.2, 30.0), (0.4, 40.0), (math.inf, 40.0)])
    assert histogram_quantile(h, 0.25) == pytest.approx(0.1)          # rank 10: end of bucket 1
    assert histogram_quantile(h, 0.5) == pytest.approx(0.15)          # rank 20: half of (0.1, 0.2]
    assert histogram_quantile(h, 0.125) == pytest.approx(0.05)        # first bucket starts at 0
    assert histogram_quantile(h, 0.875) == pytest.approx(0.3)
    assert histogram_quantile(h, 1.0) == pytest.approx(0.4)
    # Ranks in the +Inf bucket return the highest finite bound.
    assert histogram_quantile(_h([(0.1, 1.0), (math.inf, 10.0)]), 0.9) == pytest.approx(0.1)
    assert histogram_quantile(_h([(0.1, 0.0), (math.inf, 0.0)]), 0.5) is None
    assert histogram_quantile(HistogramDelta(), 0.5) is None
    with pytest.raises(ValueError):
        histogram_quantile(h, 1.5)


def test_histogram_quantile_on_real_capture(vllm_fixtures):
    w = window(_snap(vllm_fixtures, "idle"), _snap(vllm_fixtures, "batch_cap_bound"))
    h = w.histograms[TTFT]
    p50, p99 = histogram_quantile(h, 0.5), histogram_quantile(h, 0.99)
    assert 0 < p50 <= p99
    # Within the bounds of the bucket that holds the median.
    les = sorted(h.buckets)
    i = next(i for i, le in enumerate(les) if h.buckets[le] >= 0.5 * h.count)
    assert (les[i - 1] if i else 0.0) <= p50 <= les[i]
