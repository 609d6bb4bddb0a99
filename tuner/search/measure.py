"""One measured point of a knee curve: a load run at one offered rate, scored against the SLO.

The only place the search touches an engine's load path. It builds the open-loop schedule (Poisson, Gamma
or the trace's own timestamps rescaled to the rate), sizes the run so the attainment it reports has a
usable confidence interval, and condenses what came back into a `LoadRunSummary` plus a `MetricsDigest`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from tuner.engine.base import Server
from tuner.metrics.window import MetricsWindow, PREEMPTIONS, PREFIX_HITS, PREFIX_QUERIES
from tuner.replay.record import LoadRun, RequestRecord
from tuner.search.records import LatencyQuantiles, LoadRunSummary, MetricsDigest
from tuner.slo import SLO, score
from tuner.workload.arrivals import gamma_times, poisson_times, trace_rate
from tuner.workload.model import Workload, WorkloadRequest

CDF_LEVELS = [round(x, 3) for x in np.linspace(0.0, 1.0, 41)]


@dataclass
class LoadSettings:
    """How big each load run is. Defaults suit the in-process simulator (virtual time is free);
    the CLI shrinks them for engines that run in real time."""

    requests: int = 1000               # per load run; the same at every rate (common random numbers)
    max_duration_s: float | None = None  # real-time engines: cap the schedule's span (fewer requests)
    warmup_frac: float = 0.1           # requests sent in the first 10% of the span are not scored
    cooldown_frac: float = 0.05        # nor those in the last 5% (the system drains then)
    request_timeout_s: float = 120.0
    arrival: str = "poisson"           # poisson | gamma | trace
    burstiness: float = 1.0
    seed: int = 0
    #: Requests sent (and not scored) to every freshly launched server before its first load run, so
    #: shared prefixes (system prompts, RAG documents) are in its prefix cache as in a server that has
    #: been up a while: without it a candidate's first run (its race) pays a cold cache the incumbent's
    #: later runs did not.
    warmup_requests: int = 50


@dataclass
class Measurement:
    summary: LoadRunSummary
    digest: MetricsDigest
    records: list[RequestRecord] = field(repr=False)


def _sample_requests(workload: Workload, n: int, rng: np.random.Generator) -> list[WorkloadRequest]:
    """`n` requests drawn from the workload in order, wrapping around (keeps a trace's sequence)."""
    reqs = workload.requests
    start = int(rng.integers(0, len(reqs)))
    return [reqs[(start + i) % len(reqs)] for i in range(n)]


def make_schedule(workload: Workload, rate: float, settings: LoadSettings, seed: int
                  ) -> tuple[list[WorkloadRequest], list[float]]:
    n = settings.requests
    if settings.max_duration_s:
        n = max(50, min(n, int(rate * settings.max_duration_s)))
    rng = np.random.default_rng(seed)
    if settings.arrival == "trace" and workload.has_arrivals:
        scale = rate / trace_rate(workload)
        reqs = workload.requests[:n]
        t0 = reqs[0].arrival_s or 0.0
        return reqs, [((r.arrival_s or 0.0) - t0) / scale for r in reqs]
    reqs = _sample_requests(workload, n, rng)
    if settings.arrival == "gamma":
        return reqs, gamma_times(n, rate, settings.burstiness, seed)
    return reqs, poisson_times(n, rate, seed)


_SHARED_IDS: dict[int, tuple[Workload, frozenset[int]]] = {}


def shared_ids(workload: Workload) -> frozenset[int]:
    """Prefix block ids that more than one request of the workload uses: real reuse. An id used once is
    that request's private text."""
    hit = _SHARED_IDS.get(id(workload))
    if hit is not None and hit[0] is workload:
        return hit[1]
    seen: set[int] = set()
    shared: set[int] = set()
    for r in workload.requests:
        for h in set(r.prefix_hash_ids or ()):
            (shared if h in seen else seen).add(h)
    out = frozenset(shared)
    _SHARED_IDS[id(workload)] = (workload, out)
    return out


def salt_private_ids(requests: list[WorkloadRequest], shared: frozenset[int], salt: int
                     ) -> list[WorkloadRequest]:
    """Fresh private blocks for this load run: a knee search replays the same requests at several rates,
    and with the same private ids the server's prefix cache would remember every prompt of the last run
    (on real vLLM as on the simulator). Shared ids stay: their reuse is the workload's own."""
    out = []
    for r in requests:
        ids = r.prefix_hash_ids
        if not ids or all(h in shared for h in ids):
            out.append(r)
            continue
        new = [h if h in shared else -(hash((salt, h)) & 0x3FFFFFFFFFFFFFFF) - 1 for h in ids]
        out.append(r.model_copy(update={"prefix_hash_ids": new}))
    return out


def badness(records: list[RequestRecord], slo: SLO) -> float:
    """The target-quantile of each request's worst metric/threshold ratio (errors count as infinite).

    Attainment >= target exactly when this is <= 1, and unlike attainment it moves continuously with the
    rate, so the knee search can interpolate on it instead of only bisecting."""
    th = slo.thresholds
    vals = []
    for r in records:
        if not r.in_window:
            continue
        if not r.ok:
            vals.append(math.inf)
            continue
        worst = 0.0
        for m, t in th.items():
            if m == "itl":
                gaps = r.itls
                v = (max(gaps) if gaps else (r.tpot or 0.0)) * 1000.0
            else:
                v = (getattr(r, m) or 0.0) * 1000.0
            worst = max(worst, v / t.max_ms)
        vals.append(worst)
    if not vals:
        return math.inf
    vals.sort()
    k = max(0, math.ceil(float(slo.target) * len(vals)) - 1)
    return vals[k]


def digest(metrics: MetricsWindow | None, rate: float, max_num_seqs: int | None,
           window: tuple[float, float] | None = None) -> MetricsDigest:
    """Condense a run's metrics; gauge statistics over the scored window only (the drain after the last
    send would hide a growing queue)."""
    if metrics is None:
        return MetricsDigest(rate=rate, max_num_seqs=max_num_seqs)
    s = metrics.samples
    if window and window[1] > window[0]:
        inside = [x for x in s if window[0] <= x.t <= window[1]]
        s = inside if len(inside) >= 3 else s
    run = np.array([x.running for x in s] or [0.0])
    wait = np.array([x.waiting for x in s] or [0.0])
    kv = np.array([x.kv_usage for x in s] or [0.0])
    q = metrics.counter(PREFIX_QUERIES)
    h = metrics.histograms

    def mean(name: str) -> float | None:
        d = h.get(name)
        return d.sum / d.count if d and d.count else None

    third = max(1, len(wait) // 3)
    trend = float(wait[-third:].mean() - wait[:third].mean()) if len(wait) >= 3 else 0.0
    step = max(1, len(s) // 120)  # keep at most ~120 points per series in storage
    return MetricsDigest(
        samples=s[::step], running_p90=float(np.percentile(run, 90)), waiting_mean=float(wait.mean()),
        waiting_p90=float(np.percentile(wait, 90)), waiting_trend=trend, kv_usage_p90=float(np.percentile(kv, 90)),
        kv_usage_max=float(kv.max()), preemptions=metrics.counter(PREEMPTIONS),
        prefix_hit_rate=(metrics.counter(PREFIX_HITS) / q) if q else None,
        queue_time_mean_s=mean("request_queue_time_seconds"),
        prefill_time_mean_s=mean("request_prefill_time_seconds"), max_num_seqs=max_num_seqs, rate=rate)


def summarize(records: list[RequestRecord], slo: SLO, rate: float, run: LoadRun | None,
              repeats: int, wall_s: float) -> LoadRunSummary:
    """Score one load run, or `repeats` runs of the same rate pooled: rates (goodput, throughput) are
    per run, so pooled counts are divided by the number of runs (each run starts at t=0)."""
    sc = score(records, slo, window=None)
    finished = [r for r in records if r.in_window and r.ok]
    span = max((r.finish_s for r in finished), default=0.0) - min((r.sent_s or 0.0 for r in finished),
                                                                  default=0.0)
    if repeats > 1 and sc.goodput is not None:
        sc.goodput /= repeats
    return LoadRunSummary(
        rate=rate, n=sc.n, attainment=sc.attainment, ci_low=sc.ci_low, ci_high=sc.ci_high,
        passed=sc.meets_target, goodput=sc.goodput,
        throughput_rps=(len(finished) / span / repeats) if span > 0 else None,
        badness=badness(records, slo),
        p99_ms={m: st.p99_ms for m, st in sc.metrics.items()},
        p50_ms={m: st.p50_ms for m, st in sc.metrics.items()}, errors=sc.errors, binding=sc.binding,
        violations=sc.violations, repeats=repeats, duration_s=run.duration_s if run else 0.0,
        wall_s=wall_s)


def measure(server: Server, workload: Workload, slo: SLO, rate: float, settings: LoadSettings, *,
            seed: int, max_num_seqs: int | None = None, salt: int | None = None
            ) -> tuple[Measurement, LoadRun]:
    """One open-loop load run at `rate`, scored. The same `seed` gives the same requests and the same
    arrival pattern stretched to the rate, so points of one knee curve, and configurations, are compared
    on common random numbers: their differences are the engine's, not the sampling's. `salt` makes the
    request-unique prompt text fresh (each load run of one server needs its own)."""
    reqs, times = make_schedule(workload, rate, settings, seed)
    if salt is not None:
        reqs = salt_private_ids(reqs, shared_ids(workload), salt)
    span = times[-1] if times else 0.0
    t = time.perf_counter()
    run = server.run_load(reqs, times, offered_rate=rate, request_timeout_s=settings.request_timeout_s,
                          warmup_s=settings.warmup_frac * span, cooldown_s=settings.cooldown_frac * span,
                          prompt_salt=salt)
    if run.interrupted:  # the HTTP replay returns a Ctrl-C'd run instead of raising: not a measurement
        raise KeyboardInterrupt
    wall = time.perf_counter() - t
    summary = summarize(run.records, slo, rate, run, 1, wall)
    win = (run.window_start_s, run.window_end_s)
    return Measurement(summary, digest(run.metrics, rate, max_num_seqs, win), run.records), run


def latency_quantiles(records: list[RequestRecord]) -> LatencyQuantiles:
    ok = [r for r in records if r.in_window and r.ok]
    out: dict[str, list[float]] = {}
    for m in ("ttft", "tpot", "e2el"):
        v = [getattr(r, m) * 1000.0 for r in ok if getattr(r, m) is not None]
        if v:
            out[m] = [float(x) for x in np.quantile(v, CDF_LEVELS)]
    gaps = [g * 1000.0 for r in ok for g in r.itls]
    if gaps:
        out["itl"] = [float(x) for x in np.quantile(gaps, CDF_LEVELS)]
    return LatencyQuantiles(q=CDF_LEVELS, values_ms=out)
