"""A LoRA load run's own figures: the `vllm:lora_requests_info` samples condensed for the diagnosis, and
the SLO scored per adapter popularity (hot, middle and cold deciles), where adapter thrash shows first."""

from __future__ import annotations

import numpy as np

from tuner.lora.popularity import Popularity
from tuner.metrics.window import LORA_DISK_LOADS, LORA_GPU_LOADS, MetricsWindow
from tuner.replay.record import RequestRecord
from tuner.slo import SLO, score
from tuner.workload.model import Workload, WorkloadRequest


def lora_digest(metrics: MetricsWindow, window: tuple[float, float] | None) -> dict:
    """The digest's LoRA fields from `vllm:lora_requests_info` samples and the load counters."""
    ls = metrics.lora_samples
    if not ls:
        return {}
    if window and window[1] > window[0]:
        inside = [x for x in ls if window[0] <= x.t <= window[1]]
        ls = inside if len(inside) >= 3 else ls
    loads = metrics.counters.get(LORA_GPU_LOADS)
    deferred = [x.deferred for x in ls if x.deferred is not None]
    return {"lora_running_p90": float(np.percentile([x.running for x in ls], 90)),
            "lora_waiting_p90": float(np.percentile([x.waiting for x in ls], 90)), "max_lora": ls[-1].max_lora,
            "adapter_loads": loads, "adapter_disk_loads": metrics.counters.get(LORA_DISK_LOADS),
            "lora_deferred_mean": float(np.mean(deferred)) if deferred else None,
            "lora_samples": ls[::max(1, len(ls) // 120)]}


def by_popularity(records: list[RequestRecord], requests: list[WorkloadRequest], workload: Workload,
                  slo: SLO) -> dict[str, dict[str, float | None]]:
    """p99 TTFT, attainment and count of the hot, middle and cold adapters' requests (empty when the
    requests name no adapters): the cold tail is where an SLO breaks first under adapter thrash."""
    if not any(r.lora for r in requests):
        return {}
    pop = Popularity.of(workload.requests)
    groups: dict[str, list[RequestRecord]] = {}
    for rec in records:
        g = pop.group_of(requests[rec.index].lora) if rec.index < len(requests) else None
        if g is not None and rec.in_window:
            groups.setdefault(g, []).append(rec)
    out = {}
    for g, recs in groups.items():
        sc = score(recs, slo, window=None)
        ttft = sc.metrics.get("ttft")
        out[g] = {"n": float(sc.n), "attainment": sc.attainment, "p99_ttft_ms": ttft.p99_ms if ttft else None}
    return out
