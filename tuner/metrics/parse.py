"""Read vLLM's Prometheus text into one version-independent `Snapshot`.

vLLM renamed its metrics across releases (0.9.2 deprecated the `gpu_` names, about 0.12-0.13 removed them),
and a server runs one engine per data-parallel rank, each with its own label set. The diagnosis must not
care about either, so every family is reduced here to one number (or one histogram) under its *current*
name without the `vllm:` prefix and `_total` suffix:

- label sets are summed (engines, model names, `finished_reason`), except `*_perc` gauges, which are
  averaged: KV usage is a fraction of each engine's own pool, and a sum over engines would exceed 1;
- an old name is read only when its new name is absent (transition releases export both, equal).
"""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, Field

from tuner.metrics.window import HistogramDelta

PREFIX = "vllm:"
#: The HTTP simulator's own counters (how far its step loop fell behind), kept under their full names.
SIM_PREFIX = "sim:"

#: old name -> current name (both without prefix; counters without `_total`).
RENAMED = {
    "gpu_cache_usage_perc": "kv_cache_usage_perc",
    "gpu_prefix_cache_queries": "prefix_cache_queries",
    "gpu_prefix_cache_hits": "prefix_cache_hits",
    "time_per_output_token_seconds": "inter_token_latency_seconds",
}

# Canonical gauge keys.
RUNNING = "num_requests_running"
WAITING = "num_requests_waiting"
KV_USAGE = "kv_cache_usage_perc"
SAMPLED_GAUGES = (RUNNING, WAITING, KV_USAGE)

# Canonical histogram keys most callers want.
TTFT = "time_to_first_token_seconds"
ITL = "inter_token_latency_seconds"
E2EL = "e2e_request_latency_seconds"
QUEUE_TIME = "request_queue_time_seconds"
ITERATION_TOKENS = "iteration_tokens_total"

CACHE_CONFIG_INFO = "cache_config_info"


class Snapshot(BaseModel):
    """One scrape: cumulative counters and histograms, current gauges, and the cache config labels.

    `t` is the client's monotonic clock at the scrape (for placing samples in a run), `unix_t` the wall
    clock (for matching a Prometheus server's timestamps).
    """

    t: float = 0.0
    unix_t: float = 0.0
    gauges: dict[str, float] = Field(default_factory=dict)
    counters: dict[str, float] = Field(default_factory=dict)
    histograms: dict[str, HistogramDelta] = Field(default_factory=dict)
    cache_config: dict[str, str] = Field(default_factory=dict)

    def gauge(self, key: str, default: float = 0.0) -> float:
        return self.gauges.get(key, default)

    def counter(self, key: str, default: float = 0.0) -> float:
        return self.counters.get(key, default)


def _strip(name: str) -> str:
    return name[len(PREFIX):] if name.startswith(PREFIX) else name


def _prefer_new(raw: dict) -> dict:
    """Map old names to new ones, keeping the new one where both were exported."""
    out = {k: v for k, v in raw.items() if k not in RENAMED}
    for old, new in RENAMED.items():
        if old in raw and new not in out:
            out[new] = raw[old]
    return out


def parse_metrics(text: str, *, only: tuple[str, ...] | None = None, t: float | None = None,
                  unix_t: float | None = None) -> Snapshot:
    """Parse `/metrics` text. `only` (canonical names, old spellings included automatically) restricts
    parsing to those families, which makes a frequent gauge sample cheap: a real vLLM page is ~100 KB
    and a full parse takes milliseconds, long enough to delay the replay client's send schedule."""
    if only is not None:
        text = _filter_lines(text, only)
    gauges: dict[str, list[float]] = {}
    counters: dict[str, float] = {}
    hists: dict[str, HistogramDelta] = {}
    cache_config: dict[str, str] = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith(PREFIX):
            if fam.name.startswith(SIM_PREFIX) and fam.type == "counter":  # the HTTP simulator's own
                counters[fam.name] = sum(s.value for s in fam.samples if s.name.endswith("_total"))
            continue
        name = _strip(fam.name)
        if fam.type == "gauge":
            if name.endswith("_created"):
                continue
            if name == CACHE_CONFIG_INFO:
                for s in fam.samples:
                    cache_config.update({k: v for k, v in s.labels.items()
                                         if k not in ("engine", "model_name")})
                continue
            gauges.setdefault(name, []).extend(s.value for s in fam.samples)
        elif fam.type == "counter":
            counters[name] = counters.get(name, 0.0) + sum(
                s.value for s in fam.samples if s.name.endswith("_total"))
        elif fam.type == "histogram":
            h = hists.setdefault(name, HistogramDelta())
            for s in fam.samples:
                if s.name.endswith("_bucket"):
                    le = float(s.labels["le"])
                    h.buckets[le] = h.buckets.get(le, 0.0) + s.value
                elif s.name.endswith("_sum"):
                    h.sum += s.value
                elif s.name.endswith("_count"):
                    h.count += s.value
    reduced = {k: (sum(v) / len(v) if k.endswith("_perc") else sum(v)) for k, v in gauges.items() if v}
    for h in hists.values():
        h.buckets = dict(sorted(h.buckets.items()))
    return Snapshot(
        t=time.monotonic() if t is None else t,
        unix_t=time.time() if unix_t is None else unix_t,
        gauges=_prefer_new(reduced), counters=_prefer_new(counters), histograms=_prefer_new(hists),
        cache_config=cache_config,
    )


def _spellings(names: tuple[str, ...]) -> tuple[str, ...]:
    out = set(names)
    out.update(old for old, new in RENAMED.items() if new in names)
    return tuple(PREFIX + n for n in out)


def _filter_lines(text: str, names: tuple[str, ...]) -> str:
    """Keep the sample and TYPE lines of the named families (sample names are the family name plus
    an optional `_total`/`_bucket`/`_sum`/`_count` suffix, then `{` or a space)."""
    wanted = _spellings(names)
    keep = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            fam = line[7:].split(" ", 1)[0]
            if fam.startswith(wanted):
                keep.append(line)
        elif line.startswith(wanted):
            base = line.split("{", 1)[0].split(" ", 1)[0]
            for suffix in ("_total", "_bucket", "_sum", "_count"):
                if base.endswith(suffix):
                    base = base[: -len(suffix)]
                    break
            if base in wanted:
                keep.append(line)
    return "\n".join(keep) + "\n"
