"""Engine-side measurements of one load run, in vLLM's own terms.

Filled either by scraping `/metrics` (real vLLM, HTTP simulator, Prometheus) or directly by the
in-process simulator, so the diagnosis reads one shape whatever the engine. Counter values are deltas
over the measured window (vLLM counters are cumulative since launch).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

# Canonical counter keys (vLLM V1 names without the `vllm:` prefix and `_total` suffix).
PREEMPTIONS = "num_preemptions"
PREFIX_QUERIES = "prefix_cache_queries"
PREFIX_HITS = "prefix_cache_hits"
PROMPT_TOKENS = "prompt_tokens"
GENERATION_TOKENS = "generation_tokens"
REQUEST_SUCCESS = "request_success"
SPEC_DRAFTS = "spec_decode_num_drafts"           # speculative decoding: steps x sequences that drafted
SPEC_DRAFT_TOKENS = "spec_decode_num_draft_tokens"
SPEC_ACCEPTED = "spec_decode_num_accepted_tokens"
# Multi-LoRA: adapters copied into a GPU slot, and read from disk first (the CPU cache missed). vLLM 0.32
# exports no such counters (residency metrics are open PRs #51433, #54830): the simulator's own.
LORA_GPU_LOADS = "lora_gpu_loads"
LORA_DISK_LOADS = "lora_disk_loads"


class GaugeSample(BaseModel):
    t: float
    running: float
    waiting: float
    kv_usage: float


class LoraSample(BaseModel):
    """`vllm:lora_requests_info` at one time, as counts: distinct adapters of running requests, distinct
    adapters of waiting requests that do not run (waiting for a slot), and the server's `max_lora`."""

    t: float
    running: int
    waiting: int
    max_lora: int
    #: requests waiting deferred (vLLM's `num_requests_waiting_by_reason{reason="deferred"}`: skipped by the
    #: scheduler for the LoRA budget or another transient limit); None where the server does not say. On
    #: vLLM 0.32 this, not `waiting`, shows requests waiting for a slot (`tuner.metrics.parse`).
    deferred: int | None = None


class HistogramDelta(BaseModel):
    """Cumulative bucket counts (le -> count) of the window, plus sum and count."""

    buckets: dict[float, float] = Field(default_factory=dict)
    sum: float = 0.0
    count: float = 0.0


class MetricsWindow(BaseModel):
    samples: list[GaugeSample] = Field(default_factory=list)
    counters: dict[str, float] = Field(default_factory=dict)
    histograms: dict[str, HistogramDelta] = Field(default_factory=dict)
    cache_config: dict[str, str] = Field(default_factory=dict)
    lora_samples: list[LoraSample] = Field(default_factory=list)  # empty: LoRA off or not read

    def counter(self, key: str) -> float:
        return self.counters.get(key, 0.0)
