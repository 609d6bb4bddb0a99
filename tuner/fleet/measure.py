"""One fleet run, scored: attainment and p99s fleet-wide and per replica, load and cache hit rate per
replica, and the SLO over time (which seconds it was broken)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from pydantic import BaseModel, Field

from tuner.settings import default
from tuner.fleet import policies
from tuner.fleet.load import arrivals, fleet_requests
from tuner.fleet.sim import Autoscaler, Fleet, FleetRun
from tuner.sim.config import ResolvedConfig
from tuner.sim.costs import CostParams
from tuner.slo import SLO, score
from tuner.workload.model import Workload

#: Seconds of each run not scored: the replicas' prefix caches and queues fill first.
WARMUP_S = 20.0
#: The SLO over time is judged per window of arrivals this long.
BUCKET_S = 10.0


class ReplicaStats(BaseModel):
    replica: int
    routed: int
    share: float                        # of the fleet's routed requests
    prefix_hit_rate: float | None       # vllm:prefix_cache_hits / queries over the run
    attainment: float | None
    p99_ttft_ms: float | None
    p99_tpot_ms: float | None
    state: str


class FleetCheck(BaseModel):
    """A fleet at one load: the fleet-wide score and each replica's."""

    replicas: int
    policy: str
    rate: float
    n: int
    attainment: float
    meets: bool
    p99_ttft_ms: float | None
    p99_tpot_ms: float | None
    errors: int
    prefix_hit_rate: float | None
    output_tokens_per_s: float
    per_replica: list[ReplicaStats] = Field(default_factory=list)
    decisions: dict[str, int] = Field(default_factory=dict)


@dataclass
class FleetSetup:
    """What every fleet run of one verification shares: the tuned engine, the workload, the SLO."""

    cfg: ResolvedConfig
    slo: SLO
    workload: Workload
    peak: float
    cost_params: CostParams | None = None
    noise: float = field(default_factory=lambda: default("noise"))  # the run settings' own defaults
    seed: int = field(default_factory=lambda: default("seed"))
    session: str = "tenant"
    trace: Sequence[float] | None = None
    notes: list[str] = field(default_factory=list)


def run_fleet(setup: FleetSetup, replicas: int, policy: str, profile: list[tuple[float, float]],
              duration_s: float, *, fail_at: float | None = None, relaunch: bool = False,
              cold_start_s: float = 0.0, autoscaler: Autoscaler | None = None) -> FleetRun:
    """A fleet of `replicas` under `policy` offered `profile` for `duration_s` (the same arrivals and
    requests for the same setup: common random numbers across N and policies)."""
    times = arrivals(profile, duration_s, seed=setup.seed, trace=setup.trace)
    reqs = fleet_requests(setup.workload, times, seed=setup.seed, session=setup.session)
    fleet = Fleet(setup.cfg, policies.create(policy, seed=setup.seed), replicas, cost_params=setup.cost_params,
                  noise=setup.noise, seed=setup.seed, cold_start_s=cold_start_s,
                  token_times=setup.slo.needs_token_times)
    if fail_at is not None:
        fleet.fail(fail_at, relaunch=relaunch)
    return fleet.run(reqs, autoscaler=autoscaler)


def check(setup: FleetSetup, run: FleetRun, replicas: int, policy: str, rate: float,
          warmup_s: float = WARMUP_S) -> FleetCheck:
    """Score a run's requests that arrived after the warm-up, fleet-wide and per replica."""
    for r in run.records:
        r.in_window = r.scheduled_s >= warmup_s
    s = score(run.records, setup.slo)
    window = [i for i, r in enumerate(run.records) if r.in_window]
    total = len(window) or 1
    per = []
    for rep in run.replicas:
        mine = [run.records[i] for i in window if run.replica_of[i] == rep.id]
        sc = score(mine, setup.slo) if mine else None
        q = rep.core.prefix_queries
        per.append(ReplicaStats(
            replica=rep.id, routed=len(mine), share=len(mine) / total,
            prefix_hit_rate=rep.core.prefix_hits / q if q else None,
            attainment=sc.attainment if sc else None,
            p99_ttft_ms=sc.metrics["ttft"].p99_ms if sc else None,
            p99_tpot_ms=sc.metrics["tpot"].p99_ms if sc else None, state=rep.state))
    q = sum(r.core.prefix_queries for r in run.replicas)
    span = max(run.records[i].scheduled_s for i in window) - warmup_s if window else 0.0
    out_tokens = sum(run.records[i].output_tokens for i in window if run.records[i].error is None)
    return FleetCheck(replicas=replicas, policy=policy, rate=rate, n=s.n, attainment=s.attainment,
                      meets=s.meets_target, p99_ttft_ms=s.metrics["ttft"].p99_ms,
                      p99_tpot_ms=s.metrics["tpot"].p99_ms, errors=s.errors,
                      prefix_hit_rate=sum(r.core.prefix_hits for r in run.replicas) / q if q else None,
                      output_tokens_per_s=out_tokens / span if span > 0 else 0.0, per_replica=per,
                      decisions=run.decisions)


def broken_windows(setup: FleetSetup, run: FleetRun, bucket_s: float = BUCKET_S
                   ) -> list[tuple[float, float, int]]:
    """(window start, attainment, requests) for each `bucket_s` window of arrivals."""
    buckets: dict[int, list] = {}
    for r in run.records:
        r.in_window = True
        buckets.setdefault(int(r.scheduled_s // bucket_s), []).append(r)
    out = []
    for b in sorted(buckets):
        s = score(buckets[b], setup.slo, window=bucket_s)
        out.append((b * bucket_s, s.attainment, s.n))
    return out


def broken_seconds(windows: list[tuple[float, float, int]], target: float, bucket_s: float = BUCKET_S) -> float:
    return sum(bucket_s for _, att, n in windows if n and att < target)


def fmt_ms(v: float | None) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.0f} ms"


__all__ = ["FleetSetup", "FleetCheck", "ReplicaStats", "run_fleet", "check", "broken_windows",
           "broken_seconds", "WARMUP_S", "BUCKET_S", "fmt_ms"]
