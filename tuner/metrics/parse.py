"""Read vLLM's Prometheus text into one version-independent `Snapshot`.

vLLM renamed its metrics across releases (0.9.2 deprecated the `gpu_` names, about 0.12-0.13 removed them),
and a server runs one engine per data-parallel rank, each with its own label set. The diagnosis must not
care about either, so every family is reduced here to one number (or one histogram) under its *current*
name without the `vllm:` prefix and `_total` suffix:

- label sets are summed (engines, model names, `finished_reason`), except `*_perc` gauges, which are
  averaged: KV usage is a fraction of each engine's own pool, and a sum over engines would exceed 1;
- an old name is read only when its new name is absent (transition releases export both, equal).

Two families are not numbers to sum. `vllm:lora_requests_info` is a gauge whose *value* is the time it was
last set and whose labels carry the state (`running_lora_adapters`, `waiting_lora_adapters`: comma-joined
adapter names; `max_lora`); every label combination ever seen stays exported, so the current state is
the series with the largest value, read here as adapter counts (`LORA_RUNNING`, `LORA_WAITING`,
`LORA_MAX`) and kept by name in `Snapshot.lora_adapters`. vLLM 0.32 (`LoRARequestStates`,
vllm/v1/metrics/stats.py) puts every adapter with a request in flight into *both* labels (it joins the
dict keys, not those with a non-zero count), so on real vLLM the two counts are equal: the number of
distinct adapters in flight, to compare with `max_lora`. Which requests wait for an adapter slot is told
by `vllm:num_requests_waiting_by_reason{reason="deferred"}` (requests the scheduler skipped for a
transient constraint, the LoRA budget among them), read as `WAITING_DEFERRED`.
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

# Multi-LoRA serving (see the module docstring): the raw families, and the gauges read from them.
LORA_INFO = "lora_requests_info"
WAITING_BY_REASON = "num_requests_waiting_by_reason"
LORA_RUNNING = "lora_running_adapters"     # adapters named in `running_lora_adapters` now
LORA_WAITING = "lora_waiting_adapters"     # adapters named in `waiting_lora_adapters` now
LORA_MAX = "lora_max_loras"                # the server's `max_lora` label (its --max-loras)
WAITING_DEFERRED = "num_requests_waiting_deferred"
#: Families the gauge sampler parses each tick: the queue and KV gauges, and the LoRA state where exported.
SAMPLED_FAMILIES = SAMPLED_GAUGES + (LORA_INFO, WAITING_BY_REASON)

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
    #: The current `vllm:lora_requests_info` labels ("running", "waiting": comma-joined adapter names;
    #: "max_lora"); empty where the server serves no LoRA.
    lora_adapters: dict[str, str] = Field(default_factory=dict)

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
    lora: dict[str, str] = {}
    derived: dict[str, float] = {}
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
            if name == LORA_INFO:
                lora = _lora_state(fam.samples, derived)
                continue
            if name == WAITING_BY_REASON:
                deferred = [s.value for s in fam.samples if s.labels.get("reason") == "deferred"]
                if deferred:
                    derived[WAITING_DEFERRED] = sum(deferred)
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
    reduced.update(derived)
    for h in hists.values():
        h.buckets = dict(sorted(h.buckets.items()))
    return Snapshot(
        t=time.monotonic() if t is None else t,
        unix_t=time.time() if unix_t is None else unix_t,
        gauges=_prefer_new(reduced), counters=_prefer_new(counters), histograms=_prefer_new(hists),
        cache_config=cache_config, lora_adapters=lora,
    )


def _names(joined: str) -> list[str]:
    return [n for n in joined.split(",") if n]


def lora_waiting_only(labels: dict[str, str]) -> int:
    """Adapters named waiting that are not named running: the adapters waiting for a slot, where a server
    lists them so (0 on vLLM 0.32, which names the same adapters in both labels)."""
    return len(set(_names(labels.get("waiting", ""))) - set(_names(labels.get("running", ""))))


def _lora_state(samples, out: dict[str, float]) -> dict[str, str]:
    """The current LoRA state from `vllm:lora_requests_info`'s samples: the one set last (largest value,
    a Unix time), its adapter counts written into `out`, its labels returned."""
    if not samples:
        return {}
    last = max(samples, key=lambda s: s.value)
    running = last.labels.get("running_lora_adapters", "")
    waiting = last.labels.get("waiting_lora_adapters", "")
    out[LORA_RUNNING] = float(len(_names(running)))
    out[LORA_WAITING] = float(len(_names(waiting)))
    try:
        out[LORA_MAX] = float(last.labels["max_lora"])
    except (KeyError, ValueError):
        pass
    return {"running": running, "waiting": waiting, "max_lora": last.labels.get("max_lora", "")}


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
