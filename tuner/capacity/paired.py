"""Capacities and their differences with intervals, from the common windows (`tuner.capacity.windows`).

A configuration's capacity is the geometric mean of its windows' capacities, with a 95% Student-t
interval over the windows. A difference between two configurations is paired: window by window, the log
of the ratio of their capacities on the same requests and arrivals, its mean and 95% t-interval, reported
as a relative change (`exp(x) - 1`). Pairing removes what the two share (which requests a window holds,
when they arrive); what is left is how differently the two configurations serve the same traffic. The
test is the paired t-test at the 5% level, two-sided; a difference is *significant* when its interval
excludes zero.

Statistics only: what a significant difference means for the recommendation is `tuner.recommend`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from tuner.storage.records import WindowCapacity

#: The 97.5% quantile of Student's t by degrees of freedom (a two-sided 95% interval); past 30, 1.96.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
        10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101,
        19: 2.093, 20: 2.086, 22: 2.074, 24: 2.064, 26: 2.056, 28: 2.048, 30: 2.042}
LEVEL = 0.95
TEST = "paired t-test over common request windows, 95% two-sided"


def t975(df: int) -> float:
    if df <= 0:
        return math.inf
    if df in T975:
        return T975[df]
    below = max(k for k in T975 if k <= df) if df <= 30 else None
    return T975[below] if below is not None else 1.96


@dataclass(frozen=True)
class Estimate:
    """A relative quantity with its 95% interval: `value` (e.g. +0.094 for +9.4%), `low`, `high`."""

    value: float
    low: float
    high: float
    n: int                  # windows it rests on

    @property
    def significant(self) -> bool:
        """The interval excludes zero."""
        return self.low > 0 or self.high < 0

    def text(self) -> str:
        return f"{100 * self.value:+.1f}% [{100 * self.low:+.1f}%, {100 * self.high:+.1f}%]"


@dataclass(frozen=True)
class Capacity:
    """A configuration's capacity over its windows: the geometric mean and its 95% interval (req/s)."""

    rps: float
    low: float
    high: float
    n: int


def _mean_interval(xs: Sequence[float]) -> tuple[float, float]:
    """The mean of `xs` and the half-width of its 95% t-interval (inf with fewer than two)."""
    n = len(xs)
    mean = sum(xs) / n
    if n < 2:
        return mean, math.inf
    var = sum((x - mean) ** 2 for x in xs) / (n - 1)
    return mean, t975(n - 1) * math.sqrt(var / n)


def capacity(windows: Sequence[WindowCapacity]) -> Capacity | None:
    """The geometric mean of the windows' capacities (None: some window met the SLO at no rate, or none
    was measured: a capacity that holds only for some of the traffic is no capacity)."""
    caps = [w.capacity_rps for w in windows]
    if not caps or any(c is None or c <= 0 for c in caps):
        return None
    logs = [math.log(c) for c in caps]  # type: ignore[arg-type]
    mean, half = _mean_interval(logs)
    return Capacity(rps=math.exp(mean), low=math.exp(mean - half) if math.isfinite(half) else 0.0,
                    high=math.exp(mean + half) if math.isfinite(half) else math.inf, n=len(logs))


def paired_ratio(a: Sequence[WindowCapacity], b: Sequence[WindowCapacity], *, floor_rps: float = 0.01
                 ) -> Estimate | None:
    """How much more `a` serves than `b` on the same windows (`a / b - 1`, paired). A window where one of
    the two met the SLO at no rate counts at `floor_rps` for it (a large difference, as it is); windows
    where both did, or that only one of them was measured on, are left out. None: no window in common."""
    by_seed = {w.seed: w.capacity_rps for w in b}
    logs = []
    for w in a:
        if w.seed not in by_seed:
            continue
        x, y = w.capacity_rps, by_seed[w.seed]
        if x is None and y is None:
            continue
        logs.append(math.log(max(x or 0.0, floor_rps)) - math.log(max(y or 0.0, floor_rps)))
    if not logs:
        return None
    mean, half = _mean_interval(logs)
    low = math.exp(mean - half) - 1.0 if math.isfinite(half) else -1.0
    high = math.exp(mean + half) - 1.0 if math.isfinite(half) else math.inf
    return Estimate(value=math.exp(mean) - 1.0, low=low, high=high, n=len(logs))
