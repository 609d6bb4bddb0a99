"""The knee search's settings and its result (`tuner.capacity.knee`): what a caller sets and reads back,
apart from how the search walks the rates."""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner.replay.record import RequestRecord
from tuner.settings import default
from tuner.storage.records import LoadRunSummary, MetricsDigest


@dataclass
class KneeSettings:
    #: stop when (lowest fail / highest pass) - 1 <= precision (its default: `tuner.settings.KneeOptions`)
    precision: float = field(default_factory=lambda: default("precision"))
    max_runs: int = 12
    remeasure: int = 1             # extra load runs for a point whose CI straddles the target ...
    remeasure_band: float = 0.05   # ... and whose badness is this close to 1 (the verdict is a coin flip)
    min_rate: float = 0.01
    max_rate: float = 10_000.0
    #: With no incumbent to race, first send the whole run at once (rate inf): what the engine then
    #: serves is its maximum throughput, an upper bound on the knee that saves the doubling climb.
    probe_saturation: bool = True
    saturation_rate: float = 1e6
    knee_guess: float = 0.8   # first guess of the knee as a fraction of that throughput
    #: In virtual time, also a burst deeper than one load run (twice what the engine holds at once, up to
    #: `VIRTUAL_BURST_FACTOR` runs), as a real-time search always sends: it replaces the climb from
    #: 1 req/s, whose long low-rate runs are most of a real engine's time (`benchmarks/knee_search.py`
    #: stands in for one). Off by default: in-process studies and the twin pay CPU, not engine time, and
    #: the twin's fit reads the climb's low-rate points of a short-run baseline (tests/unit/test_twin.py).
    virtual_burst: bool = False
    #: A race is lost only when the candidate is clearly over the SLO at the incumbent's capacity (badness
    #: above 1 + race_band); a near miss there is inside the noise of one load run and earns the full
    #: knee search (a coin flip must not eliminate what may be the best configuration).
    race_band: float = 0.1
    #: A failing point with fewer requests than this in flight on average (Little's law: offered rate
    #: x mean E2E) is an unloaded engine: only there may the search conclude that no rate meets the SLO.
    unloaded_in_flight: float = 1.5
    #: A run too short to tell is run again with this many times the requests, up to `max_lengthen`
    #: times the load settings' `requests` (virtual time); a real-time run, bounded by its duration, is
    #: pooled with up to this many runs in all when it was short only of sends (a slow server's low rate).
    max_lengthen: int = 4  # (a verdict inside the noise: 2)
    lengthen_band: float = 0.15  # ... when its badness is this close to 1 and its verdict undecided
    #: Real time (runs capped by --max-run-s): an undecided verdict within `lengthen_band` of the SLO is
    #: pooled with up to this many more runs. Measured in-process with tune's real-time settings (chat on
    #: RTX 4090, p99 at 0.99, 8 seeds): with one extra run inside 0.05 the median capacity was 15% above
    #: the long-run truth (the highest of several coin flips passed); with 3 inside 0.15, 3% above, for 40%
    #: more engine time (`benchmarks/realtime_vs_virtual.py`).
    capped_remeasure: int = 3


@dataclass
class KneeResult:
    capacity: float | None
    upper: float | None
    points: list[LoadRunSummary]
    raced_out: bool = False
    pass_digest: MetricsDigest | None = None
    fail_digest: MetricsDigest | None = None
    fail_summary: LoadRunSummary | None = None
    pass_records: list[RequestRecord] = field(default_factory=list, repr=False)
    #: The lowest failing rate's requests: what a "no" is explained from (`tuner.capacity.explain`).
    fail_records: list[RequestRecord] = field(default_factory=list, repr=False)
    engine_s: float = 0.0
    interrupted: bool = False
    #: The capacity (what reports and plans show), and its uncertainty: the highest rate that passed with its interval clear of the target, and the
    #: lowest that failed clearly (None: no such point was measured).
    capacity_rps: float | None = None
    capacity_low_rps: float | None = None
    capacity_high_rps: float | None = None
    #: When no rate met the SLO: why, in one line.
    why_none: str | None = None
    #: Set when nearly every request of a load run failed before any rate passed: that, in one line
    #: with the server's own words (the trial is then a failure, not a capacity).
    requests_failed: str | None = None
    #: Set when load runs kept measuring the client instead of the server (`tuner.replay.check`): that,
    #: with both figures; the trial is then a failure, not a capacity.
    client_bound: str | None = None

    @property
    def runs(self) -> int:
        return sum(p.repeats for p in self.points)

    def finish(self, saturation_rate: float) -> "KneeResult":
        """Realised rates and the uncertainty from the measured points."""
        pts = [p for p in self.points if p.rate < saturation_rate]
        best = next((p for p in pts if p.rate == self.capacity and p.passed), None)
        if best is None:
            return self

        # Each schedule is rescaled to offer exactly its nominal rate (`tuner.workload.arrivals`), so the
        # nominal rate is the rate sent; a run the sequential test stopped early offered its prefix's
        # rate, within ~1/sqrt(n) of it (each point's `offered_rps` records it).
        self.capacity_rps = best.rate
        sure = [p.rate for p in pts if p.passed and p.decided and p.rate <= best.rate]
        self.capacity_low_rps = max(sure, default=None)
        clear = [p.rate for p in pts if not p.passed and p.decided and p.rate > best.rate]
        self.capacity_high_rps = min(clear, default=None)
        return self


__all__ = ["KneeSettings", "KneeResult"]
