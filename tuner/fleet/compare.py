"""The router model against the real vLLM Router: one fleet run both ways, side by side.

The same requests, arrival times, session ids, policy and replica count go once through the virtual-time
fleet (`tuner.fleet.measure`) and once in real time through the `vllm-router` binary in front of N
HTTP-simulator replicas (`tuner.fleet.real`), optionally with replica 0 stopped mid-run (the virtual
fleet fails one at the same schedule second). The replicas are always the simulator of the GPU and model
profiles: on a study of a real engine this checks the router model, not vLLM, and says so.

`check_router` reads the binary's own `--help` before anything starts, so a router that does not run, or
lacks a policy, is one error with nothing created. `benchmarks/fleet_router.py` and
`tune plan --verify RUN --real-router` both call `compare`.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, Field

from tuner.errors import UserError
from tuner.fleet.load import arrivals, draw, fleet_requests
from tuner.fleet.measure import FleetSetup, check, run_fleet
from tuner.fleet.real import ROUTER_ENV, router_binary, run_real, start_fleet
from tuner.knobs import Knobs
from tuner.metrics.window import PREFIX_HITS, PREFIX_QUERIES, REQUEST_SUCCESS
from tuner.slo import score

_POLICY_CHOICES = re.compile(r"--policy \{([^}]*)\}")


class Side(BaseModel):
    """One way of running the fleet: its score over the scored window and each replica's share."""

    attainment: float
    p99_ttft_ms: float | None
    p99_tpot_ms: float | None
    errors: int
    served_per_replica: list[float | None]        # None: a stopped replica (no second scrape)
    hit_rate_per_replica: list[float | None]
    decisions: dict[str, float] = Field(default_factory=dict)


class RealComparison(BaseModel):
    policy: str
    replicas: int
    rate: float
    duration_s: float
    time_scale: float
    warmup_s: float
    stop_replica_at: float | None
    requests: int
    replicas_are: str            # what served the real run: always the HTTP simulator, said plainly
    wall_s: float
    real: Side
    virtual: Side
    warnings: list[str] = Field(default_factory=list)

    @property
    def diff_attainment(self) -> float:
        return abs(self.real.attainment - self.virtual.attainment) / max(self.virtual.attainment, 1e-9)

    @property
    def diff_p99_ttft(self) -> float | None:
        r, v = self.real.p99_ttft_ms, self.virtual.p99_ttft_ms
        return abs(r - v) / v if r and v else None


def router_policies(binary: str) -> list[str]:
    """The policies this router binary offers, from its `--help`; a binary that does not answer `--help`
    (exits at once with an error, hangs) is a one-line error."""
    try:
        p = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UserError(f"the vLLM Router at {binary} does not run: {e}", field="--real-router") from None
    m = _POLICY_CHOICES.search(p.stdout)
    if p.returncode != 0 or m is None:
        last = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
        raise UserError(f"the vLLM Router at {binary} does not run (`--help` exited {p.returncode}: "
                        f"{last[0][:200]})", field="--real-router")
    return [x.strip() for x in m.group(1).split(",") if x.strip()]


def check_router(policies: list[str], router: str | None = None) -> str:
    """The router binary (installed, running, offering every policy asked for), before anything starts."""
    try:
        binary = router_binary(router)
    except UserError:
        raise UserError(f"the vLLM Router (vllm-router) is not installed: pip install 'slo-tuner[fleet]' (CI: "
                        f".ci/setup-router.sh), or set {ROUTER_ENV} to its binary", field="--real-router") from None
    offered = router_policies(binary)
    for p in policies:
        if p not in offered:
            raise UserError(f"the vLLM Router at {binary} has no policy {p!r} (it has: {', '.join(offered)})",
                            field="--policy")
    return binary


def _real_side(real, fleet_decisions: dict[str, float], slo, warmup_s: float) -> Side:
    for r in real.run.records:
        r.in_window = r.scheduled_s >= warmup_s
    s = score(real.run.records, slo)
    ms = real.replica_metrics
    return Side(attainment=s.attainment, p99_ttft_ms=s.metrics["ttft"].p99_ms, p99_tpot_ms=s.metrics["tpot"].p99_ms,
                errors=s.errors, served_per_replica=[m.counters.get(REQUEST_SUCCESS, 0.0) if m else None for m in ms],
                hit_rate_per_replica=[m.counters.get(PREFIX_HITS, 0.0) / m.counters[PREFIX_QUERIES]
                                      if m and m.counters.get(PREFIX_QUERIES) else None for m in ms],
                decisions=fleet_decisions)


def compare(setup: FleetSetup, gpu: str, model: str, knobs: Knobs, replicas: int, policy: str, *,
            duration_s: float, time_scale: float = 1.0, warmup_s: float = 0.0,
            stop_replica_at: float | None = None, run_dir: str | Path | None = None, router: str | None = None,
            scale_out: bool = True, prometheus: str | None = None) -> RealComparison:
    """`replicas` replicas of (`gpu`, `model`, `knobs`) under `policy` at `setup.peak` for `duration_s`
    schedule seconds, virtual then real (the real one `time_scale` times slower in wall time). Every
    process is stopped before this returns or raises; `run_dir` (default a temporary folder) holds their
    logs."""
    rate, profile = setup.peak, [(0.0, setup.peak)]
    times = arrivals(profile, duration_s, seed=setup.seed, trace=setup.trace)
    reqs = draw(setup.workload, len(times), seed=setup.seed)
    sessions = [f.key.session for f in fleet_requests(setup.workload, times, seed=setup.seed,
                                                      session=setup.session, drawn=reqs)]
    vrun = run_fleet(setup, replicas, policy, profile, duration_s, fail_at=stop_replica_at)
    v = check(setup, vrun, replicas, policy, rate, warmup_s=warmup_s)
    t0 = time.time()
    where = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="fleet-real-"))
    try:
        fleet = start_fleet(gpu, model, knobs, replicas, policy, run_dir=where, time_scale=time_scale,
                            router=router, scale_out=scale_out)
    except UserError as e:  # start_fleet stopped what it started; name this command's option
        raise UserError(e.message, field="--real-router" if e.field == "--router" else e.field) from None
    with fleet:
        real = run_real(fleet, reqs, times, offered_rate=rate, time_scale=time_scale, prometheus=prometheus,
                        stop_replica_at=stop_replica_at, sessions=sessions)
        decisions = fleet.router_decisions()
    wall = time.time() - t0
    virtual = Side(attainment=v.attainment, p99_ttft_ms=v.p99_ttft_ms, p99_tpot_ms=v.p99_tpot_ms, errors=v.errors,
                   served_per_replica=[float(r.routed) for r in v.per_replica],
                   hit_rate_per_replica=[r.prefix_hit_rate for r in v.per_replica],
                   decisions={k: float(x) for k, x in v.decisions.items()})
    real_side = _real_side(real, decisions, setup.slo, warmup_s)
    return RealComparison(policy=policy, replicas=replicas, rate=rate, duration_s=duration_s, time_scale=time_scale,
                          warmup_s=warmup_s, stop_replica_at=stop_replica_at, requests=len(times),
                          replicas_are=f"HTTP simulator (tune sim serve) of {gpu} / {model}", wall_s=round(wall, 1),
                          real=real_side, virtual=virtual,
                          warnings=disagreements(real_side, virtual, float(setup.slo.target))  # type: ignore[arg-type]
                          + list(real.run.warnings[:3]))


#: Real and modelled attainment further apart than this (relative) is said, not only printed side by side.
ATTAINMENT_GAP = 0.05


def disagreements(real: Side, virtual: Side, target: float) -> list[str]:
    """What the real run says that the fleet model did not: a verdict on the SLO that differs, or an
    attainment further off than `ATTAINMENT_GAP`. A comparison whose sides disagree must not read as a
    confirmation (a real router at 0.81 against the model's 1.00 once printed no warning)."""
    out = []
    if (real.attainment >= target) != (virtual.attainment >= target):
        out.append(f"the SLO verdicts differ: real attainment {real.attainment:.3f}, the model's "
                   f"{virtual.attainment:.3f}, target {target:g}")
    elif abs(real.attainment - virtual.attainment) > ATTAINMENT_GAP * max(virtual.attainment, 1e-9):
        out.append(f"real attainment {real.attainment:.3f} against the model's {virtual.attainment:.3f}")
    if real.errors > virtual.errors:
        out.append(f"the real run failed {real.errors} requests, the model {virtual.errors}")
    return out


def _ms(x: float | None) -> str:
    return f"{x:.0f} ms" if x is not None else "n/a"


def line(c: RealComparison) -> str:
    """One comparison as the CLI prints it: real beside virtual, with what the replicas were."""
    stop = f", replica 0 stopped at {c.stop_replica_at:g} s" if c.stop_replica_at is not None else ""
    dt = c.diff_p99_ttft
    return (f"real router {c.policy}: {c.replicas} replicas ({c.replicas_are}), {c.rate:g} req/s for "
            f"{c.duration_s:g} s at time scale {c.time_scale:g}{stop}, {c.requests} requests, {c.wall_s:g} s wall: "
            f"attainment real {c.real.attainment:.4f} vs virtual {c.virtual.attainment:.4f} "
            f"({c.diff_attainment:.1%} apart); p99 TTFT real {_ms(c.real.p99_ttft_ms)} vs virtual "
            f"{_ms(c.virtual.p99_ttft_ms)} ({f'{dt:.1%} apart' if dt is not None else 'n/a'}); "
            f"errors real {c.real.errors} vs virtual {c.virtual.errors}")


__all__ = ["RealComparison", "Side", "check_router", "compare", "line", "router_policies"]
