"""Scrape a server's `/metrics` and turn two scrapes into the `MetricsWindow` of a load run.

vLLM's counters and histograms are cumulative since launch, so a load run's share is the difference of a
scrape just before and one just after it; gauges are only meaningful as a time series, sampled during the
run by `tuner.metrics.sampler.GaugeSampler`.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import httpx

from tuner.metrics.parse import Snapshot, parse_metrics
from tuner.metrics.window import GaugeSample, HistogramDelta, LoraSample, MetricsWindow


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def scrape(base_url: str, api_key: str | None = None, *, timeout_s: float = 10.0,
           only: tuple[str, ...] | None = None) -> Snapshot:
    """GET `{base_url}/metrics` and parse it (raises `httpx.HTTPError` when the server does not answer)."""
    r = httpx.get(base_url.rstrip("/") + "/metrics", headers=_headers(api_key), timeout=timeout_s)
    r.raise_for_status()
    return parse_metrics(r.text, only=only)


async def ascrape(client: httpx.AsyncClient, base_url: str, api_key: str | None = None, *,
                  timeout_s: float = 10.0, only: tuple[str, ...] | None = None) -> Snapshot:
    """`scrape` on an existing async client (the replay client's own event loop)."""
    t = time.monotonic()
    r = await client.get(base_url.rstrip("/") + "/metrics", headers=_headers(api_key), timeout=timeout_s)
    r.raise_for_status()
    return parse_metrics(r.text, only=only, t=t)


def _delta(after: float, before: float) -> float:
    """Counter increase; a counter that went down means the server restarted, so count from zero
    (Prometheus' `increase()` rule)."""
    return after - before if after >= before else after


def histogram_delta(before: HistogramDelta | None, after: HistogramDelta) -> HistogramDelta:
    if before is None:
        return after.model_copy(deep=True)
    if after.count < before.count:  # reset
        return after.model_copy(deep=True)
    return HistogramDelta(
        buckets={le: _delta(v, before.buckets.get(le, 0.0)) for le, v in after.buckets.items()},
        sum=after.sum - before.sum, count=after.count - before.count)


def window(before: Snapshot, after: Snapshot, samples: Sequence[GaugeSample] = (),
           lora_samples: Sequence[LoraSample] = ()) -> MetricsWindow:
    """Counter and histogram deltas between two scrapes, with the gauge (and LoRA) samples taken in between.

    Keys are canonical (`tuner.metrics.window` constants for counters; current vLLM names without the
    `vllm:` prefix for histograms). A counter missing from `before` counts from zero.
    """
    counters = {k: _delta(v, before.counters.get(k, 0.0)) for k, v in after.counters.items()}
    hists = {k: histogram_delta(before.histograms.get(k), h) for k, h in after.histograms.items()}
    return MetricsWindow(samples=list(samples), counters=counters, histograms=hists,
                         cache_config=dict(after.cache_config or before.cache_config), lora_samples=list(lora_samples))


def histogram_quantile(hist: HistogramDelta, q: float) -> float | None:
    """The q-quantile (0..1) of a cumulative-bucket histogram, interpolated linearly inside the bucket
    like PromQL's `histogram_quantile`: the first bucket starts at 0, and a rank in the +Inf bucket
    returns the highest finite bound. None when the histogram is empty (PromQL gives NaN)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    buckets = sorted(hist.buckets.items())
    if not buckets or buckets[-1][1] <= 0:
        return None
    if not math.isinf(buckets[-1][0]):  # PromQL needs the +Inf bucket; treat the last one as total
        buckets.append((math.inf, buckets[-1][1]))
    if len(buckets) < 2:
        return None
    rank = q * buckets[-1][1]
    # The first bucket (the +Inf one excluded) whose cumulative count reaches the rank.
    b = next((i for i, (_, c) in enumerate(buckets[:-1]) if c >= rank), len(buckets) - 1)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    if b == 0 and buckets[0][0] <= 0:
        return buckets[0][0]
    start, (end, count) = (0.0, buckets[b]) if b == 0 else (buckets[b - 1][0], buckets[b])
    below = buckets[b - 1][1] if b > 0 else 0.0
    in_bucket = count - below
    if in_bucket <= 0:
        return start
    return start + (end - start) * (rank - below) / in_bucket
