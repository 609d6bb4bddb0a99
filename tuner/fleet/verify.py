"""`tune plan --verify RUN`: the capacity plan's replica count proved (or corrected) on a simulated fleet.

From a study's recommended configuration (the one `tune plan` sizes), in virtual time:

1. the smallest N that meets the SLO at the peak under each routing policy, searched from the plan's
   arithmetic N (down while it passes, up while it fails); both numbers are shown;
2. one replica down at the peak (N-1), and the plan's own spare (N_plan + spare - 1 serving);
3. 2x the peak for a stated window on N replicas;
4. a cold start: one replica fails and its replacement serves `cold_start_s` later (the study's own
   measured launch time unless given);
5. autoscaling from N-2 replicas under a 2x step on the summed waiting queue (`tuner.fleet.sim.Autoscaler`,
   the KEDA/HPA rule), for a few thresholds: the one with the least SLO-broken time (then the fewest
   replica-seconds) is the validated threshold the export carries.

The fleet is the simulator of the study's GPU and model (a study on a real engine: the same simulator,
not fitted to it; the report says so). Each run is scored after a warm-up; the SLO over time per 10 s
window of arrivals.
"""

from __future__ import annotations

import math
import statistics

from pydantic import BaseModel, Field

from tuner.errors import UserError
from tuner.failures import LaunchFailure
from tuner.feasibility import check_workload
from tuner.fleet import policies
from tuner.fleet.load import SESSION_KEYS, trace_of
from tuner.fleet.measure import (FleetCheck, FleetSetup, broken_seconds, broken_windows, check,
                                 run_fleet)
from tuner.fleet.sim import Autoscaler, FleetRun
from tuner.plan import Plan, check_price, plan_from_run
from tuner.profiles.gpus import get_gpu
from tuner.profiles.models import get_model
from tuner.recommend import recommend_study
from tuner.sim.config import resolve
from tuner.slo import SLO
from tuner.storage.reader import load_study_data
from tuner.workload.loader import load_workload

VERIFY_S = 120.0          # seconds at the peak per N checked (the first WARMUP_S not scored)
STEP_AT_S = 60.0          # when the 2x step (or the failure) comes
MAX_REPLICAS = 512
THRESHOLDS = (2.0, 5.0, 10.0, 20.0)   # summed waiting requests per replica the autoscaler tries


class Scenario(BaseModel):
    name: str
    what: str
    policy: str
    replicas_start: int
    attainment: float
    p99_ttft_ms: float | None
    broken_s: float
    replica_seconds: float
    max_replicas: int
    windows: list[tuple[float, float, int]] = Field(default_factory=list)
    timeline: list[tuple[float, int, int, int, int]] = Field(default_factory=list)  # t, ready, starting, waiting, running
    profile: list[tuple[float, float]] = Field(default_factory=list)
    scale_events: list[tuple[float, str, int]] = Field(default_factory=list)
    threshold: float | None = None


class PolicyResult(BaseModel):
    policy: str
    verified_n: int | None               # None: not met up to the cap
    checks: list[FleetCheck] = Field(default_factory=list)
    n_minus_1: FleetCheck | None = None


class FleetVerification(BaseModel):
    run_dir: str
    peak: float
    target: float
    plan_n: int                          # the plan's instances, headroom included
    plan_spare: int
    #: the plan's instances at the peak with no headroom (ceil(peak / rate)): what the verified N is
    #: compared with (the SLO at the peak is what the fleet simulation checks; headroom is a margin on top)
    plan_at_peak: int | None = None
    plan_headroom: float | None = None
    policies: list[PolicyResult]
    scenarios: list[Scenario] = Field(default_factory=list)
    spare_check: FleetCheck | None = None
    spare_verdict: str = ""
    cold_start_s: float
    cold_start_source: str
    threshold: float | None = None
    knobs: dict = Field(default_factory=dict)
    gpu: str | None = None
    model: str | None = None
    tp: int = 1
    price_per_gpu_hour: float | None = None
    cost_per_hour: float | None = None
    cost_per_million_output_tokens: float | None = None
    notes: list[str] = Field(default_factory=list)

    @property
    def chosen(self) -> PolicyResult:
        """The policy whose verified N is smallest (ties: the order given)."""
        met = [p for p in self.policies if p.verified_n is not None]
        return min(met, key=lambda p: p.verified_n) if met else self.policies[0]  # type: ignore[arg-type,return-value]


def setup_from_run(run_dir: str, *, workload: str | None = None, seed: int = 0, session: str = "tenant",
                   arrivals: str = "poisson", peak_rate: float | None = None) -> tuple[FleetSetup, Plan, object]:
    """The fleet's engine, workload and SLO from a finished study, and the plan it verifies."""
    if session not in SESSION_KEYS:
        raise UserError(f"unknown session key {session!r} (known: {', '.join(SESSION_KEYS)})", field="--session-key")
    data = load_study_data(run_dir)
    chosen = recommend_study(data).trial
    tuned = next((t for t in data.trials if t.number == chosen), None) if chosen is not None else None
    if tuned is None:
        raise UserError("the study has no tuned configuration (no trial met the SLO): nothing to verify",
                        file=run_dir)
    info = data.info
    gpu, model = info.settings.engine.gpu, info.settings.engine.model
    if not (gpu and model):
        raise UserError("the fleet is simulated: the study must name --gpu and --model profiles", file=run_dir)
    plan = plan_from_run(run_dir, peak_rate=peak_rate)
    try:
        cfg = resolve(get_gpu(gpu), get_model(model), tuned.record.config)
    except LaunchFailure as e:
        raise UserError(f"the tuned configuration does not launch in the simulator: {e.message}", file=run_dir) from None
    path = workload or str(info.input_path(str(info.settings.workload), run_dir))
    try:
        wl = load_workload(path)
    except FileNotFoundError:
        raise UserError("the study's workload file is gone; give --workload", file=path) from None
    slo = SLO.model_validate(info.slo)
    # the study's own pre-flight on this workload (`tuner.feasibility`): a request longer than the served
    # context is refused (or dropped, as the study was told) before any replica is simulated, not sent to
    # every replica of every fleet size
    mml = tuned.record.knobs.get("max_model_len")
    args = [*info.settings.engine.extra_args, *([f"--max-model-len={mml}"] if mml else [])]
    wl = check_workload(wl, slo, model=model, gpu=None, vllm_args=args,
                        drop_overlong=info.settings.load.drop_overlong, where=str(path)).workload
    trace = trace_of(wl) if arrivals == "trace" else None
    if arrivals == "trace" and not trace:
        raise UserError("the workload has no timestamps to rescale", field="--arrivals")
    setup = FleetSetup(cfg=cfg, slo=slo, workload=wl, peak=plan.peak_rate, noise=info.settings.engine.noise,
                       seed=seed, session=session, trace=trace)
    if not info.simulated:
        setup.notes.append("the study ran on a real engine; the fleet is the simulator of its GPU and model "
                           "profiles (not fitted to the study's launches)")
    return setup, plan, tuned.record


def cold_start_of(data_record, run_dir: str, given: float | None) -> tuple[float, str]:
    """The replica launch time: `given`, else the median of the study's measured launches."""
    if given is not None:
        if not (math.isfinite(given) and given >= 0):
            raise UserError(f"must be a finite number >= 0, got {given}", field="--cold-start-s")
        return given, "given (--cold-start-s)"
    data = load_study_data(run_dir)
    launches = [t.record.launch_s for t in data.trials if t.record.launch_s > 0]
    if not launches:
        return 0.0, "no measured launch in the study (0 s assumed)"
    med = statistics.median(launches)
    src = f"median of the study's {len(launches)} measured launches"
    if data.info.simulated:
        src += " (a simulated engine's launch: not a GPU loading weights; give --cold-start-s)"
    return med, src


def verify_n(setup: FleetSetup, policy: str, start: int) -> PolicyResult:
    """The smallest N meeting the SLO at the peak: from `start` down while it passes, up while it fails."""
    res = PolicyResult(policy=policy, verified_n=None)
    tried: dict[int, FleetCheck] = {}

    def at(n: int) -> FleetCheck:
        if n not in tried:
            run = run_fleet(setup, n, policy, [(0.0, setup.peak)], VERIFY_S)
            tried[n] = check(setup, run, n, policy, setup.peak)
        return tried[n]

    n = max(1, start)
    if at(n).meets:
        while n > 1 and at(n - 1).meets:
            n -= 1
        res.verified_n = n
    else:
        cap = min(MAX_REPLICAS, max(4 * n, n + 8))  # a policy that fails at 4x the arithmetic is reported as such
        while n < cap and not at(n).meets:
            n = min(cap, math.ceil(n * 1.25) + 1)
        if at(n).meets:  # the first passing N after a coarse step: walk back to the smallest
            while n > 1 and (n - 1) not in tried and at(n - 1).meets:
                n -= 1
            res.verified_n = n
    res.checks = [tried[k] for k in sorted(tried)]
    if res.verified_n and res.verified_n > 1:
        res.n_minus_1 = at(res.verified_n - 1)
    return res


def _scenario(setup: FleetSetup, name: str, what: str, policy: str, n: int, run: FleetRun,
              profile: list[tuple[float, float]], threshold: float | None = None) -> Scenario:
    windows = broken_windows(setup, run)
    c = check(setup, run, n, policy, setup.peak, warmup_s=0.0)
    most = max((s.ready + s.starting for s in run.samples), default=n)
    return Scenario(name=name, what=what, policy=policy, replicas_start=n, attainment=c.attainment,
                    p99_ttft_ms=c.p99_ttft_ms, broken_s=broken_seconds(windows, float(setup.slo.target)),
                    replica_seconds=run.replica_seconds(), max_replicas=most, windows=windows,
                    timeline=[(s.t, s.ready, s.starting, s.waiting, s.running) for s in run.samples],
                    profile=profile, scale_events=run.scale_events, threshold=threshold)


def scenarios(setup: FleetSetup, policy: str, n: int, cold_start_s: float, surge_s: float = 60.0
              ) -> tuple[list[Scenario], float | None]:
    """The failure and surge scenarios on N replicas; the autoscaling threshold they validate."""
    peak, out = setup.peak, []
    surge = [(0.0, peak), (STEP_AT_S, 2 * peak), (STEP_AT_S + surge_s, peak)]
    end = STEP_AT_S + surge_s + 120.0
    out.append(_scenario(setup, "surge", f"2x the peak ({2 * peak:g} req/s) for {surge_s:g} s on {n} replicas",
                         policy, n, run_fleet(setup, n, policy, surge, end), surge))
    flat = [(0.0, peak)]
    out.append(_scenario(setup, "cold start", f"one of {n} replicas fails at {STEP_AT_S:g} s; its replacement "
                         f"serves {cold_start_s:.1f} s later", policy, n,
                         run_fleet(setup, n, policy, flat, STEP_AT_S + cold_start_s + 120.0, fail_at=STEP_AT_S,
                                   relaunch=True, cold_start_s=cold_start_s), flat))
    start = max(1, n - 2)
    best: Scenario | None = None
    long_end = STEP_AT_S + 2 * surge_s + 300.0
    step = [(0.0, peak), (STEP_AT_S, 2 * peak), (STEP_AT_S + 2 * surge_s, peak)]
    for thr in THRESHOLDS:
        scaler = Autoscaler(threshold=thr, min_replicas=start, max_replicas=max(n + 2, 2 * n + 2))
        sc = _scenario(setup, "autoscale", f"from {start} replicas, 2x step for {2 * surge_s:g} s; scale on "
                       f"sum(vllm:num_requests_waiting) / {thr:g}, {scaler.tick_s:g} s ticks, "
                       f"{scaler.cooldown_s:g} s cooldown, drain before scale-down, cold start {cold_start_s:.1f} s",
                       policy, start, run_fleet(setup, start, policy, step, long_end, cold_start_s=cold_start_s,
                                                autoscaler=scaler), step, threshold=thr)
        if best is None or (sc.broken_s, sc.replica_seconds) < (best.broken_s, best.replica_seconds):
            best = sc
    assert best is not None
    out.append(best)
    return out, best.threshold


def verify(run_dir: str, *, policy_names: list[str], workload: str | None = None, seed: int = 0,
           session: str = "tenant", arrivals: str = "poisson", cold_start_s: float | None = None,
           price: float | None = None, surge_s: float = 60.0, start_n: int | None = None,
           peak_rate: float | None = None) -> FleetVerification:
    for p in policy_names:
        policies.check_policy(p)
    if not (math.isfinite(surge_s) and 0 < surge_s <= 3600):
        raise UserError(f"must be in (0, 3600] seconds, got {surge_s}", field="--surge-s")
    price = check_price(price)
    if peak_rate is not None and not (math.isfinite(peak_rate) and 0 < peak_rate <= 1e5):
        raise UserError(f"must be a number in (0, 100000] req/s, got {peak_rate}", field="--peak-rate")
    setup, plan, rec = setup_from_run(run_dir, workload=workload, seed=seed, session=session, arrivals=arrivals,
                                      peak_rate=peak_rate)
    cold, cold_src = cold_start_of(rec, run_dir, cold_start_s)
    if plan.instances is None:
        raise UserError(plan.reason or "the plan is infeasible on this hardware", file=run_dir)
    at_peak = plan.instances_at_peak or plan.instances
    results = [verify_n(setup, p, start_n or at_peak) for p in policy_names]
    ver = FleetVerification(run_dir=run_dir, peak=setup.peak, target=float(setup.slo.target),
                            plan_n=plan.instances, plan_spare=plan.spare_instances, plan_at_peak=at_peak,
                            plan_headroom=plan.headroom, policies=results,
                            cold_start_s=cold, cold_start_source=cold_src, knobs=rec.config.set_only(),  # type: ignore[attr-defined]
                            gpu=plan.gpu, model=get_model(plan.model).name if plan.model else None, tp=plan.tp, notes=list(setup.notes),
                            price_per_gpu_hour=price if price is not None else plan.price_per_gpu_hour)
    best = ver.chosen
    if best.verified_n is None:
        ver.notes.append(f"no policy met the SLO at {setup.peak:g} req/s with up to 4x the plan's replicas")
        return ver
    n = best.verified_n
    serving = plan.instances + plan.spare_instances - 1  # the plan's fleet with one replica down
    run = run_fleet(setup, serving, best.policy, [(0.0, setup.peak)], VERIFY_S)
    ver.spare_check = check(setup, run, serving, best.policy, setup.peak)
    enough = ver.spare_check.meets
    ver.spare_verdict = (f"the plan's {plan.instances} + {plan.spare_instances} spare with one replica down "
                         f"({serving} serving, {best.policy}): attainment {ver.spare_check.attainment:.4f} "
                         f"{'>=' if enough else '<'} {ver.target:g}: the spare is {'enough' if enough else 'NOT enough'}; "
                         f"verified N {n} needs {n + 1} to survive one failure")
    ver.scenarios, ver.threshold = scenarios(setup, best.policy, n, cold, surge_s)
    if ver.price_per_gpu_hour is not None:
        c = next(c for c in best.checks if c.replicas == n)
        ver.cost_per_hour = (n + 1) * plan.tp * ver.price_per_gpu_hour
        ver.cost_per_million_output_tokens = (ver.cost_per_hour / (c.output_tokens_per_s * 3600.0) * 1e6
                                              if c.output_tokens_per_s > 0 else None)
    return ver


__all__ = ["FleetVerification", "PolicyResult", "Scenario", "verify", "verify_n", "scenarios", "setup_from_run",
           "check_price", "THRESHOLDS"]
