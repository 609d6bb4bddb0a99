"""`tune gate`: launch the gated configuration again and check that it still serves what was measured
(the SLO at capacity x (1 - tolerance), optionally the capacity itself, and the quality bound)."""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import ValidationError

from tuner.capacity.knee import find_capacity
from tuner.capacity.measure import CLIENT_BOUND_RERUNS, measure, measure_run, rerun_client_bound, run_size, summarize
from tuner.engine.registry import create, engine_class, spec_of
from tuner.errors import UserError
from tuner.inputs import file_sha256, read_text
from tuner.failures import LaunchFailure
from tuner.knobs import Knobs
from tuner.quality import recheck
from tuner.settings import EngineSettings, host_engine
from tuner.slo import load_slo
from tuner.storage.quality import QualityReference
from tuner.validation import first_error
from tuner.workload.loader import load_workload
from tuner.gate.file import GateFile, apply_overrides, default_load, find_input, load_gate, load_settings
from tuner.gate.output import Check, GateResult, write_junit


def engine_settings(gate: GateFile, host: EngineSettings | None = None) -> EngineSettings:
    """The study's engine as the gate recorded it, with what this host gave (`tune gate --engine`,
    `--vllm-python`, ...: `tuner.settings.host_engine`; a `--vllm-arg` replaces the study's arguments)."""
    recorded = EngineSettings(name=gate.engine, gpu=gate.gpu, model=gate.model, noise=gate.noise,
                              extra_args=list(gate.extra_args), lora_dir=gate.lora_dir)
    return host_engine(recorded, host) if host is not None else recorded


def make_engine(gate: GateFile, settings: EngineSettings, work_dir: Path):
    """The engine, from the same registry as `tune` builds it (`tuner.engine.registry`)."""
    return create(spec_of(settings, run_dir=work_dir / "servers", seed=gate.seed, host_gpus=gate.host_gpus,
                          spec_acceptance=dict(gate.spec_acceptance)))


GATE_SEED = 1000      # the gate's load runs draw fresh arrivals and requests, not the search's own
MAX_RUNS = 3          # load runs pooled at the gated rate while the verdict is inside the noise
GROSS = 0.05          # attainment this far below the target needs no more runs to be called broken


def check_rate(server, workload, slo, rate: float, load, *, max_runs: int = MAX_RUNS):
    """Load runs at `rate`, pooled while the attainment's 95% interval straddles the target.

    Returns (pooled summary, verdict): "holds" (attainment >= target), "noise" (below the target but the
    interval still reaches it: not a demonstrated regression), "broken" (the whole interval is below), or
    "unmeasured" (every try was client-bound, `tuner.replay.check`: the gate cannot pass on it).
    A regression gate must fail on a regression, not on one unlucky draw of a p99 from a few hundred
    requests, and must not pass on a lucky one either: hence pooling, then the interval."""
    target = float(slo.target)
    from dataclasses import replace

    runs = []
    longer = 0
    for i in range(max_runs):
        dropped: list = []  # the client's timings, not the server's: run again, as the knee search does
        m = rerun_client_bound(lambda: measure_run(server, workload, slo, rate, load,
                                                   seed=load.seed + GATE_SEED + i), dropped)
        if len(dropped) > CLIENT_BOUND_RERUNS:
            s = summarize(m.run.records, slo, rate, [m.run], [m.verdict], m.wall_s)
            s.verdict, s.passed = "client_bound", False
            return s, "unmeasured"
        while m.verdict.reason == "too_short" and longer < 2:  # as the knee search: longer, never passed
            bigger = replace(load, requests=2 * load.requests)
            if run_size(rate, bigger) <= run_size(rate, load):
                break
            load, longer = bigger, longer + 1
            m = measure_run(server, workload, slo, rate, load, seed=load.seed + GATE_SEED + i)
        runs.append(m)
        s = summarize([r for m in runs for r in m.run.records], slo, rate, [m.run for m in runs],
                      [m.verdict for m in runs], sum(m.wall_s for m in runs))
        if not s.passed and s.verdict in ("overloaded", "too_short"):
            break  # the engine did not keep up: no pooling changes that
        # Runs of a few hundred requests vary more than the binomial interval says (bursts make
        # requests' latencies correlated), so only a pass or a gross failure ends the pooling early.
        if s.passed or s.attainment < target - GROSS:
            break
    verdict = "holds" if s.passed else ("noise" if s.ci_high >= target and s.verdict not in (
        "overloaded", "too_short") else "broken")
    return s, verdict


def _measure(gate: GateFile, settings: EngineSettings, knobs: dict, workload_path: Path, slo_path: Path,
             full: bool, work_dir: Path, gate_dir: Path = Path(".")) -> tuple[list[Check], float | None]:
    workload, slo = load_workload(workload_path), load_slo(slo_path)
    engine_name = settings.name
    load = load_settings(gate.load or default_load(engine_name))
    virtual = engine_class(engine_name).virtual_time
    if virtual != engine_class(gate.engine).virtual_time:
        # sized for virtual time (1000 requests a run) or for the wall clock (200 within 60 s): re-size
        # for the engine it runs on now, keeping the arrival process and seed
        load = load_settings({**default_load(engine_name, load.arrival), "seed": load.seed,
                              "burstiness": load.burstiness, "max_concurrency": load.max_concurrency})
    engine = make_engine(gate, settings, work_dir)
    # an engine in virtual time runs no server process: it takes no server arguments
    args = [*Knobs(**knobs).flags(), *(settings.extra_args if not virtual else [])]
    with_args = f" with {' '.join(args)}" if args else " with vLLM's defaults"
    checks: list[Check] = []
    t0 = time.perf_counter()
    try:
        server = engine.launch(Knobs(**knobs))
    except LaunchFailure as e:
        checks.append(Check(name="launch", passed=False, seconds=time.perf_counter() - t0,
                            message=f"does not launch{with_args}: {e.kind}: {e.message}"))
        return checks, None
    checks.append(Check(name="launch", passed=True, message=f"launched{with_args}",
                        seconds=time.perf_counter() - t0))
    cap = None
    with server:
        rate = gate.check_rate
        t0 = time.perf_counter()
        # warm-up at half the rate, as the knee search always measured lower rates on a server before
        # reaching the knee: the gate compares a warmed server with a warmed server
        measure(server, workload, slo, rate / 2, load, seed=load.seed + GATE_SEED - 1)
        s, verdict = check_rate(server, workload, slo, rate, load)
        held = {"holds": "holds", "noise": "holds within the noise", "broken": "BROKEN",
                "unmeasured": "NOT MEASURED (the load client measured itself, not the server: "
                              + "; ".join(s.client_check.reasons if s.client_check else []) + ")"}[verdict]
        why = "" if s.passed else (f", {s.errors} failed or timed out" if s.errors else "") + (
            f", binding {s.binding}" if s.binding else "") + "".join(
            f", p99 {k.upper()} {s.p99_ms.get(k):.0f} ms" for k in slo.thresholds
            if s.p99_ms.get(k) is not None)
        checks.append(Check(name=f"slo at {rate:.3g} req/s", passed=verdict not in ("broken", "unmeasured"),
                            seconds=time.perf_counter() - t0,
                            message=(f"SLO {held} at {rate:.3g} req/s (gated {gate.capacity_rps:.3g} x "
                                     f"{1 - gate.tolerance:g}): attainment {s.attainment:.4f} vs target "
                                     f"{slo.target:g} (95% CI {s.ci_low:.3f}-{s.ci_high:.3f}, n={s.n}, "
                                     f"{s.repeats} run{'s' if s.repeats > 1 else ''}){why}")))
        if gate.quality is not None:
            checks.append(_check_quality(gate, gate_dir, server, engine_class(engine_name).simulated))
        if full:
            t0 = time.perf_counter()
            res = find_capacity(server, workload, slo, start_rate=rate, load=load)
            cap, upper = res.capacity, res.upper
            floor = gate.check_rate
            # the knee lies in [capacity, upper): a drop is demonstrated only when all of it is below
            top = upper if upper is not None else (cap or 0.0) * 1.05
            ok = cap is not None and (cap >= floor * (1 - 1e-9) or top > floor)
            drop = f"{100 * (cap / gate.capacity_rps - 1):+.1f}%" if cap else "none passed"
            rng = f"{cap:.3g}-{upper:.3g}" if cap and upper else (f"{cap:.3g}" if cap else "none")
            checks.append(Check(name="capacity", passed=ok, seconds=time.perf_counter() - t0,
                                message=f"capacity {rng} req/s ({drop} vs gated {gate.capacity_rps:.3g}; "
                                        f"must reach {floor:.3g})"))
    return checks, cap


def run_gate(gate_path: str | Path, *, overrides: list[str] | None = None,
             full: bool = False, allow_changed: bool = False, workload: str | None = None,
             slo: str | None = None, junit: str | Path | None = None,
             work_dir: str | Path | None = None, host: EngineSettings | None = None) -> GateResult:
    """Re-measure the gated configuration; see the module docstring for the verdicts and exit codes.
    `host`: what this host gives for the engine (another engine's name, its vLLM, its server arguments)."""
    import tempfile

    gate_path = Path(gate_path)
    gate = load_gate(gate_path)
    knobs = apply_overrides(gate.knobs, overrides or [])
    settings = engine_settings(gate, host)
    checks: list[Check] = []
    changed = []
    for ref, given, what in [(gate.workload, workload, "workload"), (gate.slo, slo, "slo")]:
        p = find_input(ref, gate_path.parent, given, what)
        digest = file_sha256(p)
        same = digest == ref.sha256
        msg = (f"{what} {p} unchanged" if same else
               f"{what} {p} CHANGED since the gate was written (sha256 {digest[:12]} != {ref.sha256[:12]})")
        checks.append(Check(name=f"{what} unchanged", passed=same or allow_changed, message=msg))
        if not same:
            changed.append(msg)
        if what == "workload":
            workload_path = p
        else:
            slo_path = p
    if changed and not allow_changed:
        result = GateResult(exit_code=2, verdict="ERROR", checks=checks)
        if junit:
            write_junit(result, junit)
        raise UserError("; ".join(changed) + ": re-run `tune` for a new gate, or pass --allow-changed")
    if work_dir is not None:
        measured, cap = _measure(gate, settings, knobs, workload_path, slo_path, full, Path(work_dir),
                                 gate_path.parent)
    else:  # server logs live only as long as the gate; pass work_dir to keep them
        with tempfile.TemporaryDirectory(prefix="tune-gate-") as wd:
            measured, cap = _measure(gate, settings, knobs, workload_path, slo_path, full, Path(wd),
                                     gate_path.parent)
    checks += measured
    ok = all(c.passed or c.skipped for c in checks)
    result = GateResult(exit_code=0 if ok else 1, verdict="PASS" if ok else "FAIL", checks=checks,
                        measured_capacity_rps=cap)
    if junit:
        write_junit(result, junit)
    return result


def _check_quality(gate: GateFile, gate_dir: Path, server, simulated: bool) -> Check:
    """The gated launch's answers against the baseline's reference, judged by the study's bound."""
    assert gate.quality is not None
    t0 = time.perf_counter()
    p = find_input(gate.quality.reference, gate_dir, None, "quality-reference")
    try:
        ref = QualityReference.model_validate_json(read_text(p, "quality reference"))
    except ValidationError as e:
        field, msg = first_error(e)
        raise UserError(f"not the quality reference `tune` wrote: {msg}", file=p, field=field or None) from None
    res = recheck(server, ref, gate.quality.bound, simulated=simulated)
    if res.status != "measured":
        return Check(name="quality", passed=True, skipped=True, message=f"quality {res.line()}",
                     seconds=time.perf_counter() - t0)
    ok = res.rejected is None
    return Check(name="quality", passed=ok, seconds=time.perf_counter() - t0,
                 message=(f"quality {'within the bound' if ok else 'BROKEN: ' + str(res.rejected)}: "
                          f"{res.model_copy(update={'rejected': None}).line()} "
                          f"against the baseline's answers (trial {ref.trial})"))


