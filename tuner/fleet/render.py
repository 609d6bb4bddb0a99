"""The fleet verification as text (the terminal); its pages and timeline plot: `tuner.report.fleet`."""

from __future__ import annotations

from tuner.fleet.measure import fmt_ms
from tuner.fleet.verify import THRESHOLDS, FleetVerification, PolicyResult


def _plan_n(v: FleetVerification) -> str:
    if v.plan_at_peak is None or v.plan_at_peak == v.plan_n:
        return f"plan N = {v.plan_n} (arithmetic)"
    return (f"plan N at the peak = {v.plan_at_peak} (arithmetic, no headroom; the plan's {v.plan_n} adds its "
            f"{v.plan_headroom:g} headroom)")


def _agreement(v: FleetVerification, verified: int | None) -> str:
    """Whether the fleet simulation agrees with the plan's arithmetic at the peak (within one replica)."""
    plan = v.plan_at_peak or v.plan_n
    if verified is None:
        return ""
    d = verified - plan
    return (": agrees with the plan within one replica" if abs(d) <= 1 else
            f": {abs(d)} {'more' if d > 0 else 'fewer'} than the plan's arithmetic")


def lines(v: FleetVerification) -> list[str]:
    """The verification's findings, one per line, the numbers as measured in virtual time."""
    out = [head_line(v)]
    for p in v.policies:
        first, *rest = policy_lines(v, p)
        out += [first] + [f"  {x}" for x in rest]
    return out + tail_lines(v)


def head_line(v: FleetVerification) -> str:
    """What was verified, and how."""
    return (f"fleet verification of {v.run_dir}: {v.model} on {v.gpu}, tuned knobs {v.knobs or 'vLLM defaults'}, "
            f"peak {v.peak:g} req/s, target attainment {v.target:g} (virtual time, {120:g} s per N, first 20 s "
            "not scored)")


def policy_lines(v: FleetVerification, p: PolicyResult) -> list[str]:
    """One routing policy's findings: its verified N first (named by the policy, so the line stands alone
    on a terminal), then one replica down and the verified N's latencies and load shares (which the
    terminal indents under it and the pages put under the policy's heading)."""
    tried = ", ".join(f"N={c.replicas}: {c.attainment:.4f}" for c in p.checks)
    got = f"verified N = {p.verified_n}" if p.verified_n else "not met within 4x the plan"
    out = [f"{p.policy}: {_plan_n(v)}, {got}{_agreement(v, p.verified_n)}  [{tried}]"]
    if p.n_minus_1 is not None:
        c = p.n_minus_1
        out.append(f"one replica down at the peak (N-1 = {c.replicas}): attainment {c.attainment:.4f}, "
                   f"p99 TTFT {fmt_ms(c.p99_ttft_ms)}, p99 TPOT {fmt_ms(c.p99_tpot_ms)}")
    best = next((c for c in p.checks if c.replicas == p.verified_n), None)
    if best is not None:
        hit = f"{best.prefix_hit_rate:.2f}" if best.prefix_hit_rate is not None else "n/a"
        shares = [f"{r.share:.2f}" for r in best.per_replica]
        out.append(f"at N = {best.replicas}: p99 TTFT {fmt_ms(best.p99_ttft_ms)}, p99 TPOT "
                   f"{fmt_ms(best.p99_tpot_ms)}, prefix-cache hit rate {hit}, load share per replica "
                   f"{min(shares)}-{max(shares)}")
    return out


def tail_lines(v: FleetVerification) -> list[str]:
    """The findings past the choice of policy: spare, scenarios (each run under the chosen policy, which
    its line names), autoscaling, cost."""
    out = [v.spare_verdict] if v.spare_verdict else []
    for s in v.scenarios:
        out.append(f"{s.name} ({s.policy}): {s.what}: SLO broken {s.broken_s:g} s (10 s windows), attainment "
                   f"{s.attainment:.4f}, p99 TTFT {fmt_ms(s.p99_ttft_ms)}, {s.replica_seconds / 3600:.2f} "
                   f"replica-hours, at most {s.max_replicas} replicas")
    if v.threshold is not None:
        out.append(threshold_line(v))
    out.append(f"cold start: {v.cold_start_s:.1f} s ({v.cold_start_source})")
    if v.cost_per_hour is not None:
        per_m = (f", {v.cost_per_million_output_tokens:.3f} per million output tokens at the peak"
                 if v.cost_per_million_output_tokens is not None else "")
        out.append(f"cost: {v.cost_per_hour:,.2f}/h for the verified N + 1 spare at {v.price_per_gpu_hour:g} "
                   f"per GPU-hour{per_m}")
    return out + [f"note: {n}" for n in v.notes]


__all__ = ["head_line", "lines", "policy_lines", "tail_lines", "threshold_line"]


def threshold_line(v: FleetVerification) -> str:
    """The autoscaling threshold, called validated only where its scenario kept the SLO throughout: the
    threshold is the best of those tried, which is not the same as good enough."""
    sc = next((s for s in v.scenarios if s.name == "autoscale" and s.threshold == v.threshold), None)
    tried = ", ".join(f"{t:g}" for t in THRESHOLDS)
    if sc is None or sc.broken_s <= 0:
        return f"autoscaling threshold validated: {v.threshold:g} waiting requests per replica (tried {tried})"
    return (f"autoscaling threshold {v.threshold:g} waiting requests per replica: the best of {tried}, and NOT "
            f"validated: starting from {sc.replicas_start} replicas the SLO stayed broken {sc.broken_s:g} s of the "
            f"2x step while new replicas started ({v.cold_start_s:.1f} s cold start each); a higher floor of "
            "replicas (the export's is the verified N + 1) or a faster cold start shortens that")
