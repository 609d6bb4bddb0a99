"""Badness against rate, fitted over all of a knee search's points: where the next load run should go.

Interpolating between the highest pass and the lowest fail uses two points and throws the rest away; a
failing point whose badness reads infinite (a p99 of timed-out requests) gives no slope at all, and the
search then halves the bracket. A queue's latency grows like 1 / (1 - rate / saturation), so the
*reciprocal* of badness falls about linearly with the rate and reaches 0 at saturation:

    1 / badness  ~  A * (1 - rate / M)          (A: 1 / badness of an idle engine, M: saturation)

Every point with a finite badness contributes (the rate-inf burst's throughput is one at 0), weighted by
how close it is to the bracket's middle, where the line bends least from the truth; a fail past the cliff
(infinite badness, a growing queue) only bounds the knee (`tuner.capacity.knee` bisects there). With only one point near the knee the intercept `A` sets the slope: it is the incumbent's, when
the search races one (a study's configurations share a workload and an SLO, so their curves differ
mostly in scale), or `DEFAULT_INTERCEPT` (the simulator's four scenarios read 2.1-2.4). Those two
pseudo-points (the intercept at rate 0, the burst at its throughput) stand in for what the points cannot
say; points that span a doubling of the rate or more say it themselves and are fitted alone (`OWN_SPAN`),
and so do a climb's passes (`tuner.capacity.knee` passes `own_span=1`: two are enough there).
"""

from __future__ import annotations

import math
from typing import Sequence

from tuner.storage.records import LoadRunSummary

#: 1 / badness of a nearly idle engine, when neither the points nor an incumbent say (chat 2.4, strict
#: TPOT 2.15, Azure trace 2.1 on the simulator's scenarios)
DEFAULT_INTERCEPT = 2.2
#: The intercept's pseudo-point weighs this much (a point on the knee weighs 1 + FLOOR_WEIGHT)
PRIOR_WEIGHT = 0.1
#: The rate-inf burst's throughput, a point at 1 / badness = 0, weighs this much: a burst preempts and
#: serves less than a steady stream can, or (real time) more than a minute-long run keeps up with
BURST_WEIGHT = 0.1
#: A pass at under a quarter of the SLO (1 / badness above this) is on the flat part of the curve, where an
#: idle engine's latency, not the queue, sets the badness: fitted, a run of them outweighed the two points
#: by the knee (a climb's seven passes at 1 / badness 10-15 put the knee at the fail above it)
MAX_RECIPROCAL = 4.0
FLOOR_WEIGHT = 0.05  # every point counts a little, however far from the knee
#: Points whose rates span at least this factor are fitted alone, without the intercept's and the burst's
#: pseudo-points. Those sit at the ends of the rate axis, where a weight of 0.1 still out-levers the
#: points, and their queue model (1 / badness falling linearly to 0 at the burst's throughput) is not
#: every engine's: under a strict TPOT SLO an idle engine is at badness 0.8 (1 / badness 1.25, not the
#: default 2.2) and the curve stays flat to a cliff at 10.6 req/s, below a burst that served 16. With the
#: pseudo-points a climb from 1 req/s crept 1.2x a run (every fitted knee just above the last pass, where
#: the points' own line put it at 11 req/s) and ran out of runs at 8.1 req/s without a fail. Points near
#: the knee only (a race, a burst's start) span less, and keep the pseudo-points' regularisation; a climb
#: (passes only, no fail yet) fits its own from two points on, its next rate capped at twice the last
OWN_SPAN = 2.0
#: Points within about this log-distance of the bracket's middle count most (the line is a chord of a
#: curve that bends towards saturation: only near the knee is it close to the curve) ...
RATE_WIDTH = 0.2
#: ... or, before there is a bracket, those within this much of 1 / badness = 1
KNEE_WIDTH = 0.4


def reciprocal(p: LoadRunSummary) -> float | None:
    """1 / badness of a point: just over 1 for a pass that reads infinite (the target quantile fell
    between a good request and a timed-out one); None for a fail that reads infinite or whose queue grew
    (near the knee the curve falls off a cliff: a fail there bounds the knee, its 0 would drag the line
    to the pass below it), and for a point without a badness."""
    g = p.badness
    if not p.passed and (p.verdict == "overloaded" or g is None or not math.isfinite(g)):
        return None  # past the cliff (timeouts, a growing queue): a bound on the knee, not a slope
    if g is None:
        return None
    if not math.isfinite(g):
        return 1.001
    y = 1.0 / max(g, 1e-3)
    if y > MAX_RECIPROCAL:
        return None  # far under the knee, where latency is flat: a bound, not a point of the line
    return max(y, 1.0) if p.passed else min(y, 1.0)  # a pass is at or under the knee, a fail above


def _weight(rate: float, y: float, center: float | None) -> float:
    if center:
        return FLOOR_WEIGHT + math.exp(-(math.log(rate / center) / RATE_WIDTH) ** 2)
    return FLOOR_WEIGHT + math.exp(-((y - 1.0) / KNEE_WIDTH) ** 2)


def fit_line(points: Sequence[tuple[float, float, float]]) -> tuple[float, float] | None:
    """(intercept, slope) of the weighted least-squares line through (rate, 1 / badness, weight)."""
    sw = sum(w for _, _, w in points)
    if sw <= 0:
        return None
    mx = sum(w * x for x, _, w in points) / sw
    my = sum(w * y for _, y, w in points) / sw
    sxx = sum(w * (x - mx) ** 2 for x, _, w in points)
    if sxx <= 0:
        return None
    slope = sum(w * (x - mx) * (y - my) for x, y, w in points) / sxx
    return my - slope * mx, slope


def curve_points(points: Sequence[LoadRunSummary], saturation_rate: float,
                 burst_rps: float | None = None, center: float | None = None
                 ) -> list[tuple[float, float, float]]:
    """(rate, 1 / badness, weight) of the points that have a verdict on the server, plus the burst."""
    out = []
    for p in points:
        if p.rate >= saturation_rate or p.verdict in ("client_bound", "too_short", "errors"):
            continue
        y = reciprocal(p)
        if y is not None:
            out.append((p.rate, y, _weight(p.rate, y, center)))
    if burst_rps:
        out.append((burst_rps, 0.0, BURST_WEIGHT))
    return out


def intercept_of(points: Sequence[LoadRunSummary], saturation_rate: float = 1e5) -> float | None:
    """An incumbent's fitted intercept `A` (None unless its points span a slope that falls)."""
    line = fit_line(curve_points(points, saturation_rate))
    if line is None or line[1] >= 0 or line[0] <= 1.0:
        return None
    return line[0]


def knee_estimate(points: Sequence[LoadRunSummary], saturation_rate: float, *,
                  burst_rps: float | None = None, intercept: float | None = None,
                  center: float | None = None, own_span: float = OWN_SPAN) -> float | None:
    """The rate where the fitted 1 / badness crosses 1, or None when the points do not say (a line
    that does not fall). `center`: the middle of the bracket so far, whose neighbours weigh most.
    `own_span`: points whose rates span this factor (and more than one rate) are fitted alone."""
    pts = curve_points(points, saturation_rate, None, center)
    if not pts and not burst_rps:
        return None
    rates = [x for x, _, _ in pts]
    if rates and max(rates) > min(rates) and max(rates) >= own_span * min(rates):
        line = fit_line(pts)  # the points span enough of the curve to set its slope themselves
    else:
        a = intercept if intercept is not None and intercept > 1.0 else DEFAULT_INTERCEPT
        burst = [(burst_rps, 0.0, BURST_WEIGHT)] if burst_rps else []
        line = fit_line([*pts, *burst, (0.0, a, PRIOR_WEIGHT)])
    if line is None:
        return None
    b0, slope = line
    if slope >= 0 or b0 <= 1.0:
        return None
    x = (1.0 - b0) / slope
    return x if math.isfinite(x) and x > 0 else None


__all__ = ["DEFAULT_INTERCEPT", "OWN_SPAN", "knee_estimate", "intercept_of", "fit_line", "curve_points", "reciprocal"]
