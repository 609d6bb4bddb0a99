"""One measured point of a knee curve: a load run at one offered rate, scored against the SLO.

The only place the search touches an engine's load path. It builds the open-loop schedule (Poisson, Gamma
or the trace's own timestamps rescaled to the rate), sizes the run so the attainment it reports has a
usable confidence interval, and condenses what came back into a `LoadRunSummary` plus a `MetricsDigest`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable
from dataclasses import dataclass, field

import numpy as np

from tuner.engine.base import Server
from tuner.limits import LoadSpec
from tuner.bench.result import sent_records, sent_span
from tuner.capacity.lora import by_popularity, lora_digest
from tuner.metrics.window import (MetricsWindow, PREEMPTIONS, PREFIX_HITS, PREFIX_QUERIES, SPEC_ACCEPTED,
                                  SPEC_DRAFT_TOKENS, SPEC_DRAFTS)
from tuner.replay.check import bound_ms, check_run, voids
from tuner.replay.record import LoadRun, RequestRecord
from tuner.storage.records import ClientCheck, LatencyQuantiles, LoadRunSummary, MetricsDigest
from tuner.capacity.verdict import SteadySettings, StopRule, Verdict, judge
from tuner.slo import SLO, Score, badness_of, score, threshold_limits, worst_ratio, worst_ratios
from tuner.speculative import measured_acceptance
from tuner.workload.arrivals import gamma_times, poisson_times
from tuner.workload.model import Workload, WorkloadRequest

CDF_LEVELS = [round(x, 3) for x in np.linspace(0.0, 1.0, 41)]


_SPEC = LoadSpec.model_fields


@dataclass
class LoadSettings:
    """How big each load run is. Defaults suit the in-process simulator (virtual time is free);
    the CLI shrinks them for engines that run in real time."""

    # the defaults are `LoadSpec`'s (tuner.limits), where a gate file's `load:` section is validated
    requests: int = _SPEC["requests"].default  # per load run at most; the same at every rate (common random numbers)
    max_duration_s: float | None = None  # real-time engines: cap the schedule's span (fewer requests)
    #: Stop a load run as soon as its verdict is certain (`tuner.capacity.verdict`): the run is sized
    #: to the SLO's percentile by the data, up to `requests` and `max_duration_s`.
    sequential: bool = _SPEC["sequential"].default
    steady_tolerance: float = _SPEC["steady_tolerance"].default  # served may fall short of offered by this
    latency_spans: float = _SPEC["latency_spans"].default  # the scored window lasts this many p99 E2E latencies
    warmup_frac: float = _SPEC["warmup_frac"].default      # requests sent in the first 10% of the span: not scored
    cooldown_frac: float = _SPEC["cooldown_frac"].default  # nor those in the last 5% (the system drains then)
    request_timeout_s: float = _SPEC["request_timeout_s"].default
    arrival: str = _SPEC["arrival"].default            # poisson | gamma | trace
    burstiness: float = _SPEC["burstiness"].default
    seed: int = _SPEC["seed"].default
    #: Requests sent (and not scored) to every freshly launched server before its first load run, so
    #: shared prefixes (system prompts, RAG documents) are in its prefix cache as in a server that has
    #: been up a while: without it a candidate's first run (its race) pays a cold cache the incumbent's
    #: later runs did not.
    warmup_requests: int = _SPEC["warmup_requests"].default
    #: Closed loop (`vllm bench serve --max-concurrency`): at most this many requests in flight, a due
    #: send waits for a free slot. None (the default): open loop, the only honest capacity measurement
    #: (REFERENCE.md section 1); set it to reproduce a published closed-loop measurement.
    max_concurrency: int | None = None
    #: A rate above which no run passes early (`SteadySettings.pass_ceiling_rps`); the knee search sets
    #: it from its rate-inf burst's throughput.
    pass_ceiling_rps: float | None = None


#: A real-time load run's request cap: it only bounds a very high rate, so that a run lasts its whole
#: span (`REALTIME_MAX_RUN_S`) up to 500 req/s. A lower cap cut runs near a fast server's knee short (4,000
#: requests: 27 s at 150 req/s against the reference's 60 s), and a short run meets an SLO at a rate
#: where a queue grows too slowly to show in it: studies read 1.16-1.34x the reference.
REALTIME_MAX_REQUESTS = 30_000
#: A real-time load run's default span (`tune --max-run-s`).
REALTIME_MAX_RUN_S = 60.0
#: A real-time run is stopped early as overloaded only after this many sends in the in-flight fit (a
#: real server's throughput jitters over seconds: `tuner.capacity.verdict.SteadySettings`)
REALTIME_EARLY_OVERLOAD_SENDS = 300
#: ... and only after its in-flight fit spans this many seconds (`SteadySettings.early_overload_s`)
REALTIME_EARLY_OVERLOAD_S = 20.0


def engine_load_settings(virtual_time: bool, *, requests: int | None = None, max_run_s: float | None = None,
                         arrival: str = LoadSettings.arrival, seed: int = LoadSettings.seed) -> LoadSettings:
    """The load runs `tune` and `tune gate` size for an engine: 1,000 requests in virtual time (free);
    in real time each run is bounded by `max_run_s` and ends as soon as the sequential test decides
    (`tuner.capacity.verdict`), so the request cap only bounds a very high rate."""
    if virtual_time:
        return LoadSettings(requests=requests or LoadSettings.requests, arrival=arrival, seed=seed)
    return LoadSettings(requests=requests or REALTIME_MAX_REQUESTS, max_duration_s=max_run_s or REALTIME_MAX_RUN_S,
                        arrival=arrival, seed=seed, request_timeout_s=60.0)


@dataclass
class Measurement:
    summary: LoadRunSummary
    digest: MetricsDigest
    records: list[RequestRecord] = field(repr=False)


#: A load run's requests come from this many stretches of the workload, each contiguous (multi-turn
#: conversations keep their order and their prefix reuse), spread over the whole file, so that one
#: run's requests represent the workload rather than one stretch of a heavy-tailed trace.
WINDOW_BLOCKS = 8


def _sample_requests(workload: Workload, n: int, rng: np.random.Generator) -> list[WorkloadRequest]:
    """`n` requests from `WINDOW_BLOCKS` contiguous stretches at random places (wrapping around)."""
    reqs = workload.requests
    blocks = max(1, min(WINDOW_BLOCKS, n // 50, len(reqs) // max(1, n // WINDOW_BLOCKS)))
    sizes = [n // blocks + (1 if i < n % blocks else 0) for i in range(blocks)]
    out: list[WorkloadRequest] = []
    for size in sizes:
        start = int(rng.integers(0, len(reqs)))
        out += [reqs[(start + i) % len(reqs)] for i in range(size)]
    return out


def run_size(rate: float, settings: LoadSettings) -> int:
    """Requests in a load run at `rate`: `requests`, cut to what `max_duration_s` allows at that rate.
    No minimum overrides the cap: a run that cannot tell in that time is judged too short, not passed."""
    n = settings.requests
    if settings.max_duration_s and math.isfinite(rate):
        n = min(n, max(2, int(rate * settings.max_duration_s) + 1))
    return n


def make_schedule(workload: Workload, rate: float, settings: LoadSettings, seed: int
                  ) -> tuple[list[WorkloadRequest], list[float]]:
    n = run_size(rate, settings)
    rng = np.random.default_rng(seed)
    if settings.arrival == "trace" and workload.has_arrivals:
        # a contiguous stretch of the trace at a random place, time-scaled so that *it* offers `rate`
        reqs_all = workload.requests
        n = min(n, len(reqs_all))
        start = int(rng.integers(0, len(reqs_all) - n + 1))
        reqs = reqs_all[start:start + n]
        t0 = reqs[0].arrival_s or 0.0
        times = [(r.arrival_s or 0.0) - t0 for r in reqs]
        span = times[-1] if times else 0.0
        k = (n - 1) / rate / span if n > 1 and span > 0 else 0.0
        return reqs, [t * k for t in times]
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


_SALTED: dict[tuple, tuple[list[WorkloadRequest], list[WorkloadRequest]]] = {}
SALTED_CACHE = 64   # salted request lists kept (a twin's fit replays the same few runs hundreds of times)


def salted(workload: Workload, requests: list[WorkloadRequest], salt: int) -> list[WorkloadRequest]:
    """`salt_private_ids` of a schedule's requests, remembered: the requests of a schedule depend on its
    size and seed, not its rate, so every configuration's k-th knee-search run and every replay of a fit
    salts the same list (common random numbers); copying a few hundred requests each time was a tenth of
    the twin's time."""
    key = (id(workload), salt, len(requests), id(requests[0]) if requests else 0, id(requests[-1]) if requests else 0)
    hit = _SALTED.get(key)
    if hit is not None and len(hit[0]) == len(requests) and all(a is b for a, b in zip(hit[0], requests)):
        return hit[1]
    out = salt_private_ids(requests, shared_ids(workload), salt)
    if len(_SALTED) >= SALTED_CACHE:
        _SALTED.pop(next(iter(_SALTED)))
    _SALTED[key] = (list(requests), out)
    return out


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

    rate_accepted, mean_length = measured_acceptance(metrics.counter(SPEC_DRAFTS), metrics.counter(SPEC_DRAFT_TOKENS),
                                                     metrics.counter(SPEC_ACCEPTED))
    third = max(1, len(wait) // 3)
    trend = float(wait[-third:].mean() - wait[:third].mean()) if len(wait) >= 3 else 0.0
    step = max(1, len(s) // 120)  # keep at most ~120 points per series in storage
    return MetricsDigest(
        samples=s[::step], running_p90=float(np.percentile(run, 90)), waiting_mean=float(wait.mean()),
        waiting_p90=float(np.percentile(wait, 90)), waiting_trend=trend, kv_usage_p90=float(np.percentile(kv, 90)),
        kv_usage_max=float(kv.max()), preemptions=metrics.counter(PREEMPTIONS),
        prefix_hit_rate=(metrics.counter(PREFIX_HITS) / q) if q else None,
        queue_time_mean_s=mean("request_queue_time_seconds"),
        prefill_time_mean_s=mean("request_prefill_time_seconds"), max_num_seqs=max_num_seqs, rate=rate,
        spec_acceptance_rate=rate_accepted, spec_acceptance_length=mean_length, **lora_digest(metrics, window))


def steady_settings(settings: LoadSettings) -> SteadySettings:
    """The sequential test's settings for these load runs: real time (runs capped by a duration) stops
    a run as overloaded only on more evidence than virtual time needs, and does not wait for a decided
    fail's queue to drain (`cut_after_sends`; virtual time keeps the drain, whose latencies the twin's
    fit and the simulated studies' points were measured with)."""
    realtime = settings.max_duration_s is not None
    return SteadySettings(tolerance=settings.steady_tolerance, latency_spans=settings.latency_spans,
                          early_overload_sends=REALTIME_EARLY_OVERLOAD_SENDS if realtime else 100,
                          early_overload_s=REALTIME_EARLY_OVERLOAD_S if realtime else 0.0,
                          pass_ceiling_rps=settings.pass_ceiling_rps, cut_after_sends=realtime)


def _throughput(records: list[RequestRecord]) -> float | None:
    """Finished requests per second while the engine was busy: the completion rate between the 20th and
    the 80th percentile of the finish times. For a burst that is the engine's saturated service rate,
    its maximum throughput; finished / (last finish - first send) would count the tail, where the last
    few requests drain in a small batch, and the ramp before the first finishes."""
    t = sorted(r.finish_s for r in records if r.in_window and r.ok and r.finish_s is not None)
    if len(t) < 10:
        start = min((r.sent_s or 0.0 for r in records if r.in_window and r.ok), default=0.0)
        span = (t[-1] - start) if t else 0.0
        return len(t) / span if span > 0 else None
    a, b = int(0.2 * (len(t) - 1)), int(0.8 * (len(t) - 1))
    return (b - a) / (t[b] - t[a]) if t[b] > t[a] else None


def _goodput_bench(runs: list[LoadRun], slo: SLO, ratio_of: dict[int, float]) -> float | None:
    """vLLM `bench serve`'s goodput: good requests / the run's duration (first send to last end), over
    every request the run sent, warm-up and cool-down included. `ratio_of`: worst ratios already known,
    by `id` of the record (`summarize`'s); a record not among them is judged here."""
    limits = threshold_limits(slo)
    good = dur = 0.0
    for run in runs:
        sent = sent_records(run.records)
        good += sum(1 for r in sent if (ratio_of[id(r)] if id(r) in ratio_of else worst_ratio(r, limits)) <= 1.0)
        dur += sent_span(sent)
    return good / dur if dur > 0 else None


def pool_verdicts(verdicts: list[Verdict], sc: Score) -> Verdict:
    """Several runs at one rate: each must have kept up and lasted long enough (or been short only of
    sends: `Verdict.short_of_sends`); the attainment is the pooled one (more requests, a narrower
    interval)."""
    worst = next((v for v in verdicts if not v.steady and not v.short_of_sends), None)
    if len(verdicts) == 1 or worst is not None:
        return worst or verdicts[0]
    v = dataclasses.replace(verdicts[-1], n=sc.n, good=sc.n_good, ci_low=sc.ci_low, ci_high=sc.ci_high,
                            errors=sc.errors)
    v.passed = sc.meets_target
    v.decided = sc.ci_low >= sc.target if v.passed else sc.ci_high < sc.target
    slow = sc.n - sc.n_good - sc.errors
    v.reason = "meets" if v.passed else (
        "errors" if sc.errors > (1 - sc.target) * sc.n and sc.errors >= slow else "misses")
    return v


def summarize(records: list[RequestRecord], slo: SLO, rate: float, runs: list[LoadRun],
              verdicts: list[Verdict], wall_s: float) -> LoadRunSummary:
    """Score one load run, or several runs of the same rate pooled: rates (goodput, throughput) are
    per run, so pooled counts are divided by the number of runs (each run starts at t=0)."""
    repeats = max(1, len(runs))
    sc = score(records, slo, window=None)
    # the per-request check once a record: the badness (in-window requests) and bench's goodput (every
    # sent one) both read it; judged twice over they were a twentieth of the README's main job
    ratios = worst_ratios(records, slo)
    v = pool_verdicts(verdicts, sc) if verdicts else None
    if repeats > 1 and sc.goodput is not None:
        sc.goodput /= repeats
    thr = _throughput(records)
    warnings = list(dict.fromkeys(w for run in runs for w in run.warnings))
    n, attained, lo, hi = sc.n, sc.attainment, sc.ci_low, sc.ci_high
    if v is not None and len(runs) == 1 and runs[0].stopped_s is not None and v.decided and v.n:
        # the sequential test stopped the run on what it knew then: the line shows that verdict's own
        # figures, so a run never reads as meeting the target while labelled a failure (or the reverse)
        n, attained, lo, hi = v.n, v.good / v.n, v.ci_low, v.ci_high
    return LoadRunSummary(
        rate=rate, offered_rps=v.offered_rps if v else None, served_rps=v.served_rps if v else None,
        departure_rps=v.departure_rps if v else None,
        verdict=v.reason if v else "", decided=bool(v and v.decided),
        stopped_early=any(run.stopped_s is not None for run in runs),
        n=n, attainment=attained, ci_low=lo, ci_high=hi,
        passed=bool(v.passed) if v else sc.meets_target, goodput=sc.goodput,
        goodput_bench=_goodput_bench(runs, slo, dict(zip(map(id, records), ratios))),
        throughput_rps=(thr / repeats) if thr else None,
        badness=badness_of((x for r, x in zip(records, ratios) if r.in_window), slo),
        p99_ms={m: st.p99_ms for m, st in sc.metrics.items()},
        p50_ms={m: st.p50_ms for m, st in sc.metrics.items()}, errors=sc.errors,
        errors_by_cause=sc.errors_by_cause, error_example=sc.error_example, warnings=warnings + sc.warnings, binding=sc.binding,
        violations=sc.violations, repeats=repeats, duration_s=sum(run.duration_s for run in runs),
        wall_s=wall_s, client_check=runs[-1].client_check if runs else None)


@dataclass
class Measured:
    """One load run: its summary inputs, kept so a point measured again can be pooled."""

    run: LoadRun
    verdict: Verdict
    wall_s: float
    requests: list[WorkloadRequest] = field(default_factory=list, repr=False)  # the schedule's, by index


def measure_run(server: Server, workload: Workload, slo: SLO, rate: float, settings: LoadSettings, *,
                seed: int, salt: int | None = None, sequential: bool | None = None) -> Measured:
    """One open-loop load run at `rate`, judged (`tuner.capacity.verdict`). The same `seed` gives the same
    requests and the same arrival pattern stretched to the rate, so points of one knee curve, and
    configurations, are compared on common random numbers: their differences are the engine's, not
    the sampling's. `salt` makes the request-unique prompt text fresh (each load run of one server
    needs its own)."""
    reqs, times = make_schedule(workload, rate, settings, seed)
    if salt is not None:
        reqs = salted(workload, reqs, salt)
    span = times[-1] if times else 0.0
    warmup_s = settings.warmup_frac * span
    steady = steady_settings(settings)
    rule = StopRule(slo, steady, warmup_s) if (settings.sequential if sequential is None else sequential) \
        else None
    t = time.perf_counter()
    extra = {"stop_when": rule} if rule else {}
    if settings.max_concurrency is not None:  # only then: an engine without a closed loop keeps working
        extra["max_concurrency"] = settings.max_concurrency
    run = server.run_load(reqs, times, offered_rate=rate, request_timeout_s=settings.request_timeout_s,
                          warmup_s=warmup_s, cooldown_s=settings.cooldown_frac * span, prompt_salt=salt,
                          **extra)
    if run.interrupted:  # the HTTP replay returns a Ctrl-C'd run instead of raising: not a measurement
        raise KeyboardInterrupt
    wall = time.perf_counter() - t
    if rule is not None and rule.verdict is not None and run.stopped_s is not None:
        verdict = rule.verdict
    else:
        verdict = judge(run.records, slo, steady)
    if run.wall_clock:  # a real-time run: whose timings are they?
        check_run(run, bound_ms(slo.ttft.max_ms if slo.ttft is not None else None))
    return Measured(run, verdict, wall, reqs)


#: A load run whose timings were the client's (`tuner.replay.check.voids`) is run again this many times;
#: still the client's, it says nothing about the server (the knee search and the gate then stop).
CLIENT_BOUND_RERUNS = 2


def rerun_client_bound(measure_once: Callable[[], Measured], dropped: list[ClientCheck],
                       on_run: Callable[[Measured], None] | None = None) -> Measured:
    """`measure_once()`, again while its client-bound flag voids its verdict, until `dropped` (the checks of
    the voided runs, shared by the caller's other attempts at the same rate) holds more than
    `CLIENT_BOUND_RERUNS`. The last run is returned; it is still the client's when `dropped` is that long."""
    while True:
        m = measure_once()
        if on_run is not None:
            on_run(m)
        c = m.run.client_check
        if c is None or not voids(c, m.verdict.passed, m.verdict.reason):
            return m
        dropped.append(c)
        if len(dropped) > CLIENT_BOUND_RERUNS:
            return m


def measure(server: Server, workload: Workload, slo: SLO, rate: float, settings: LoadSettings, *,
            seed: int, max_num_seqs: int | None = None, salt: int | None = None,
            sequential: bool | None = None) -> tuple[Measurement, LoadRun]:
    """`measure_run`, summarised and digested: one point of a knee curve."""
    m = measure_run(server, workload, slo, rate, settings, seed=seed, salt=salt, sequential=sequential)
    run = m.run
    summary = summarize(run.records, slo, rate, [run], [m.verdict], m.wall_s)
    summary.by_popularity = by_popularity(run.records, m.requests, workload, slo)
    win = (run.window_start_s, run.window_end_s)
    return Measurement(summary, digest(run.metrics, rate, max_num_seqs, win), run.records), run


def latency_quantiles(records: list[RequestRecord]) -> LatencyQuantiles:
    ok = [r for r in records if r.in_window and r.ok and not r.truncated]
    out: dict[str, list[float]] = {}
    for m in ("ttft", "tpot", "e2el"):
        v = [getattr(r, m) * 1000.0 for r in ok if getattr(r, m) is not None]
        if v:
            out[m] = [float(x) for x in np.quantile(v, CDF_LEVELS)]
    gaps = [g * 1000.0 for r in ok for g in r.itls]
    if gaps:
        out["itl"] = [float(x) for x in np.quantile(gaps, CDF_LEVELS)]
    return LatencyQuantiles(q=CDF_LEVELS, values_ms=out)
