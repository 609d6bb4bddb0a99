"""How a workload's traffic spreads over its adapters: Zipf popularity, hot and cold deciles, the working set.

Multi-tenant LoRA traffic is long-tailed (a few hot tenants, many cold): the hot adapters stay resident,
the cold ones are loaded on demand, and the cold tail is where an SLO breaks first. The *working set* is
how many distinct adapters the requests in flight name at once: when it exceeds `max_loras`, requests
wait for a slot (vLLM schedules at most `max_loras` distinct adapters in one step) and adapters are
loaded and evicted over and over.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

#: The share of adapters in the hot and in the cold decile (by the workload's own request counts).
DECILE = 0.1


def zipf_weights(n: int, alpha: float) -> np.ndarray:
    """Popularity of `n` adapters ranked 1..n, p_k ~ 1 / k^alpha (alpha 0: uniform), summing to 1. The
    skewed distribution of SGLang's `bench_serving --lora-request-distribution skewed`."""
    w = 1.0 / np.arange(1, n + 1, dtype=float) ** alpha
    return w / w.sum()


@dataclass(frozen=True)
class Popularity:
    """Requests per adapter, most popular first, and which adapters form the hot and cold deciles."""

    counts: tuple[tuple[str, int], ...]
    base_requests: int  # requests that name no adapter (the base model)

    @classmethod
    def of(cls, requests: Iterable[Any]) -> "Popularity":
        c = Counter(r.lora for r in requests)
        base = c.pop(None, 0)
        return cls(tuple(sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))), base)

    @property
    def adapters(self) -> int:
        return len(self.counts)

    def _decile(self) -> int:
        return max(1, round(DECILE * self.adapters))

    @property
    def hot(self) -> frozenset[str]:
        """The most requested tenth of the adapters (at least one)."""
        return frozenset(n for n, _ in self.counts[:self._decile()])

    @property
    def cold(self) -> frozenset[str]:
        """The least requested tenth of the adapters (at least one; none with fewer than two adapters)."""
        return frozenset(n for n, _ in self.counts[-self._decile():]) if self.adapters >= 2 else frozenset()

    def group_of(self, adapter: str | None) -> str | None:
        """"hot", "cold" or "middle" for an adapter, None for the base model."""
        if adapter is None:
            return None
        return "hot" if adapter in self.hot else "cold" if adapter in self.cold else "middle"

    def shares(self) -> list[tuple[str, float]]:
        total = sum(n for _, n in self.counts) or 1
        return [(name, n / total) for name, n in self.counts]


def expected_distinct(shares: Sequence[float], k: float) -> float:
    """Expected distinct adapters among `k` requests drawn independently with these shares:
    sum_i 1 - (1 - p_i)^k (a fractional `k` interpolates)."""
    p = np.asarray(shares, dtype=float)
    return float(np.sum(1.0 - (1.0 - p) ** max(k, 0.0)))


def working_set(pop: Popularity, in_flight: float) -> float:
    """Distinct adapters among `in_flight` requests in flight at once (rate x latency, Little's law)."""
    return expected_distinct([s for _, s in pop.shares()], in_flight)


#: The in-flight counts `tune workload inspect` shows the working set at (and rate x latency with --rate).
IN_FLIGHT_SHOWN = (4, 16, 64, 256)


def adapter_summary(requests: Sequence[Any], catalog: Any = None, rate: float | None = None,
                    latency_s: float = 1.0, top: int = 10) -> dict[str, Any] | None:
    """What `tune workload inspect` shows of a workload's adapters (None when it names none): how many,
    their ranks (from the catalog, where given), the most and least requested, the hot and cold deciles'
    shares of the traffic, and the working set at a few in-flight counts (and at `rate` x `latency_s`)."""
    pop = Popularity.of(requests)
    if not pop.adapters:
        return None
    total = sum(n for _, n in pop.counts) + pop.base_requests
    share = dict(pop.shares())
    ranks = sorted({catalog.by_name[n].rank for n, _ in pop.counts if n in catalog.by_name}) if catalog else []
    in_flight = {str(k): round(working_set(pop, k), 1) for k in IN_FLIGHT_SHOWN}
    if rate is not None:
        in_flight[f"{rate:g} req/s x {latency_s:g} s"] = round(working_set(pop, rate * latency_s), 1)
    return {
        "adapters": pop.adapters, "base_model_requests": pop.base_requests,
        "catalog_adapters": len(catalog) if catalog is not None else None, "ranks": ranks,
        "most_requested": [{"adapter": n, "requests": c, "share": round(share[n], 4)} for n, c in pop.counts[:top]],
        "least_requested": [{"adapter": n, "requests": c} for n, c in pop.counts[-min(top, 5):]],
        "hot_decile_share": round(sum(share[n] for n in pop.hot) * (total - pop.base_requests) / total, 4),
        "cold_decile_share": round(sum(share[n] for n in pop.cold) * (total - pop.base_requests) / total, 4),
        "working_set": in_flight,
    }
