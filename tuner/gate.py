"""Regression gate: a CI check that the tuned configuration still serves what the tuning run measured.

Every run leaves `gate.yaml`: the tuned knobs, the engine/GPU/model, the workload and SLO files with their
SHA-256, the measured capacity with its bracket and confidence interval, and a tolerance (10%). `tune gate`
launches that configuration again (with the study runner's own engine, load-run and scoring code), warms
it with one run at half the rate, and measures at capacity x (1 - tolerance): the SLO must still hold
there. Runs there are pooled (up to three, fresh draws each) while the verdict is inside the noise, and
only an attainment whose whole 95% interval lies below the target fails. With `--full` it also
re-measures the capacity. The rate is below the knee by the tolerance on purpose: a check exactly at the
knee would fail half the time on noise alone.

The gate launches with every server argument the study used: the knobs' flags and the study's
`--vllm-arg`s (`extra_args`; a `--vllm-arg` given to `tune gate` replaces them), so a configuration tuned
with extra flags is not reported as a regression for failing to launch without them.

Inputs that changed since the gate was written are reported as such and stop the gate (exit 2) unless
`--allow-changed`: a new workload has a new knee, and comparing against the old one would be silent
nonsense. Exit codes: 0 pass, 1 regression (no launch, SLO broken at the gated rate, capacity dropped
beyond the tolerance), 2 bad input.
"""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner import __version__
from tuner.capacity.knee import find_capacity
from tuner.capacity.measure import (CLIENT_BOUND_RERUNS, LoadSettings, engine_load_settings, measure, measure_run,
                                    rerun_client_bound, run_size, summarize)
from tuner.engine.registry import create, engine_class, names as engine_names, spec_of
from tuner.errors import UserError
from tuner.inputs import file_sha256, parse_yaml, read_text, yaml_line
from tuner.failures import LaunchFailure
from tuner.knobs import Knobs
from tuner.limits import MAX_RATE_RPS, MAX_SEED, check_load
from tuner.quality import recheck
from tuner.recommend import recommend_study
from tuner.settings import EngineSettings, host_engine
from tuner.slo import QualityBound, load_slo
from tuner.storage.quality import ATTR, QualityReference, load_reference
from tuner.storage.reader import load_study_data
from tuner.validation import first_error
from tuner.workload.loader import load_workload

DEFAULT_TOLERANCE = 0.10
QUALITY_REFERENCE = "quality-reference.json"   # the baseline's answers, beside gate.yaml


class FileRef(BaseModel):
    path: str
    sha256: str


def default_load(engine: str, arrival: str = "poisson") -> dict:
    """Load-run sizing as `tune` uses it for this engine (`tuner.capacity.measure.engine_load_settings`):
    the engine's clock decides it (`Engine.virtual_time`), not its name."""
    from dataclasses import asdict

    return asdict(engine_load_settings(engine_class(engine).virtual_time, arrival=arrival))


def load_settings(load: dict, where: str | Path | None = None, root=None):
    """The gate's `load` mapping as the search's `LoadSettings`, each field in the range the study's own
    options allow (`tuner.limits.LoadSpec`): `requests: 0` is a user error, not a gate that measured
    nothing and passed."""
    return LoadSettings(**check_load(load, where, root))


class GateQuality(BaseModel):
    """The SLO's quality bound and the baseline's answers it is judged against (`tuner.quality`)."""

    model_config = ConfigDict(extra="forbid")
    reference: FileRef
    bound: dict


class GateFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = 1
    created_unix: float = 0.0
    tool_version: str = ""
    engine: str
    gpu: str | None = None
    model: str | None = None
    #: simulated engines: the study's launch-to-launch noise and its seed (`tuner.settings.EngineSettings`)
    noise: float = Field(0.0, ge=0, le=1, allow_inf_nan=False)
    seed: int = Field(0, ge=0, le=MAX_SEED, strict=True)
    #: simulated engines: the GPUs of the study's host (its search space's `host_gpus`)
    host_gpus: int | None = Field(None, ge=1)
    knobs: dict = Field(default_factory=dict)
    #: simulated engines: the study's stated speculative acceptance rates (its search space's)
    spec_acceptance: dict[str, float] = Field(default_factory=dict)
    #: every server argument the study launched with: the knobs' flags, then `extra_args`
    serve_args: list[str] = Field(default_factory=list)
    #: the study's own `--vllm-arg`s: the gate launches with them too (a `--vllm-arg` given to `tune gate`
    #: replaces them)
    extra_args: list[str] = Field(default_factory=list)
    #: the LoRA adapters the study served (`--lora-dir`); the gate serves them too
    lora_dir: str | None = None
    workload: FileRef
    slo: FileRef
    capacity_rps: float = Field(gt=0, le=MAX_RATE_RPS, allow_inf_nan=False)
    #: lowest failing rate: the knee lies in [capacity, upper)
    capacity_upper_rps: float | None = Field(None, gt=0, allow_inf_nan=False)
    attainment: float | None = None               # at capacity, with its 95% Wilson interval
    attainment_ci: list[float] | None = None
    tolerance: float = Field(default=DEFAULT_TOLERANCE, ge=0, lt=1, allow_inf_nan=False)
    load: dict = Field(default_factory=dict)      # LoadSettings of each load run (empty: tune's defaults)
    source_run: str | None = None
    source_trial: int | None = None
    #: the study's quality bound: the gated launch's answers are compared with the baseline's again
    quality: GateQuality | None = None

    @property
    def check_rate(self) -> float:
        return self.capacity_rps * (1 - self.tolerance)


def write_gate(run_dir: str | Path, *, path: str | Path | None = None,
               tolerance: float = DEFAULT_TOLERANCE, trial: int | None = None) -> Path | None:
    """Write `gate.yaml` for the recommended configuration of the study in `run_dir` (the study runner calls this
    at the end of a run; `tune report` rewrites it with the report). Returns the file's path, or None when
    no configuration met the SLO at any rate: there is no capacity to hold a configuration to.
    `trial` gates another trial than the tuned one (e.g. the baseline, to watch vLLM upgrades)."""
    data = load_study_data(run_dir)
    info = data.info
    # the recommended configuration (`tuner.recommend`), as the report's headline and tuned-config.yaml
    # name it: vLLM's defaults when no gain was significant
    rec_trial = recommend_study(data).trial
    tuned = next((t for t in data.trials if t.number == rec_trial), None) if rec_trial is not None else None
    if trial is not None:
        tuned = next((t for t in data.trials if t.number == trial), None)
        if tuned is None:
            raise UserError(f"no trial {trial} in the study", file=run_dir, field="--trial")
    rec = tuned.record if tuned else None
    if rec is None or rec.capacity_rps is None:
        if trial is not None:
            raise UserError(f"trial {trial} has no measured capacity", file=run_dir, field="--trial")
        return None
    knee = [r for r in rec.load_runs if r.rate == rec.capacity_rps]
    eng, space = info.settings.engine, info.search_space or {}
    gate = GateFile(created_unix=time.time(), tool_version=info.tool_version or __version__,
                    engine=eng.name, gpu=eng.gpu, model=eng.model, noise=eng.noise, seed=info.settings.seed,
                    host_gpus=space.get("host_gpus"), knobs=rec.knobs,
                    spec_acceptance=dict(space.get("spec_acceptance") or {}),
                    serve_args=[*rec.config.flags(), *eng.extra_args],
                    extra_args=list(eng.extra_args), lora_dir=eng.lora_dir,
                    workload=FileRef(path=str(info.settings.workload), sha256=info.workload_sha256),
                    slo=FileRef(path=str(info.settings.slo), sha256=info.slo_sha256),
                    capacity_rps=rec.capacity_rps, capacity_upper_rps=rec.capacity_upper_rps,
                    attainment=knee[-1].attainment if knee else None,
                    attainment_ci=[knee[-1].ci_low, knee[-1].ci_high] if knee else None,
                    tolerance=tolerance,
                    load=info.load or default_load(eng.name, info.settings.load.arrival),
                    source_run=str(run_dir), source_trial=tuned.number if tuned else None,
                    quality=_gate_quality(data, run_dir))
    out = Path(path) if path is not None else Path(run_dir) / "gate.yaml"
    head = ("# Regression gate written by slo-tuner: `tune gate gate.yaml` re-measures this configuration.\n"
            "# Exit 0 pass, 1 regression, 2 bad input (including a workload or SLO file that changed).\n")
    out.write_text(head + yaml.safe_dump(gate.model_dump(mode="json"), sort_keys=False), encoding="utf-8")
    return out


def _gate_quality(data, run_dir: str | Path) -> GateQuality | None:
    """The quality part of the gate: the SLO's bound and the baseline's reference answers, written beside
    the gate as `quality-reference.json` (None: the study has no bound or no reference)."""
    bound = (data.info.slo or {}).get("quality")
    ref = load_reference({ATTR: data.quality_reference})
    if not bound or ref is None:
        return None
    p = Path(run_dir) / QUALITY_REFERENCE
    p.write_text(ref.model_dump_json(), encoding="utf-8")
    return GateQuality(reference=FileRef(path=str(p), sha256=file_sha256(p)), bound=bound)


def _check_quality(gate: GateFile, gate_dir: Path, server, simulated: bool) -> Check:
    """The gated launch's answers against the baseline's reference, judged by the study's bound."""
    assert gate.quality is not None
    t0 = time.perf_counter()
    p = _find_input(gate.quality.reference, gate_dir, None, "quality-reference")
    ref = QualityReference.model_validate_json(p.read_text(encoding="utf-8"))
    res = recheck(server, ref, QualityBound(**gate.quality.bound), simulated=simulated)
    if res.status != "measured":
        return Check(name="quality", passed=True, skipped=True, message=f"quality {res.line()}",
                     seconds=time.perf_counter() - t0)
    ok = res.rejected is None
    return Check(name="quality", passed=ok, seconds=time.perf_counter() - t0,
                 message=(f"quality {'within the bound' if ok else 'BROKEN: ' + str(res.rejected)}: "
                          f"{res.model_copy(update={'rejected': None}).line()} "
                          f"against the baseline's answers (trial {ref.trial})"))


def load_gate(path: str | Path) -> GateFile:
    """A gate file, checked as strictly as the study that wrote it: a gate that measured nothing (no
    requests, a NaN capacity) must be exit 2, never a PASS."""
    p = Path(path)
    data, root = parse_yaml(read_text(p, "gate file"), p)
    if not isinstance(data, dict):
        raise UserError("not a gate file (expected a mapping)", file=p)
    try:
        gate = GateFile.model_validate(data)
    except ValidationError as e:
        field, msg = first_error(e)
        raise UserError(msg, file=p, line=yaml_line(root, field.split(".") if field else []),
                        field=field) from None
    load_settings(gate.load, p, root)
    if gate.engine not in engine_names():
        raise UserError(f"unknown engine {gate.engine!r} (known: {', '.join(engine_names())})", file=p,
                        line=yaml_line(root, ["engine"]), field="engine")
    try:
        Knobs(**gate.knobs)
    except ValidationError as e:
        err = e.errors()[0]
        raise UserError(err["msg"], file=p, field="knobs." + ".".join(map(str, err["loc"]))) from None
    return gate


def apply_overrides(knobs: dict, overrides: list[str]) -> dict:
    """`key=value` pairs (YAML scalars; `default` or `none` unsets the knob) over the gated knobs."""
    out = dict(knobs)
    for item in overrides:
        if "=" not in item:
            raise UserError(f"expected key=value, got {item!r}", field="--config-override")
        key, raw = item.split("=", 1)
        key = key.strip().lstrip("-").replace("-", "_")
        if key not in Knobs.model_fields:
            raise UserError(f"unknown knob {key!r} (known: {', '.join(Knobs.model_fields)})",
                            field="--config-override")
        value = None if raw.strip().lower() in ("default", "none", "null", "") else yaml.safe_load(raw)
        out[key] = value
        out = {k: v for k, v in out.items() if v is not None}
    try:
        Knobs(**out)
    except ValidationError as e:
        err = e.errors()[0]
        raise UserError(f"{err['msg']}", field=f"--config-override {'.'.join(map(str, err['loc']))}") from None
    return out


def _find_input(ref: FileRef, gate_dir: Path, given: str | None, what: str) -> Path:
    """The file as given on the command line, else as recorded (absolute, then relative to the current
    directory, then to the gate file's directory: a committed gate travels with its repository)."""
    cands = [Path(given)] if given else [Path(ref.path)]
    if not given and not Path(ref.path).is_absolute():
        cands.append(gate_dir / ref.path)
    for c in cands:
        if c.is_file():
            return c
    raise UserError(f"{what} file not found (recorded as {ref.path}; pass --{what} PATH)", field=f"--{what}")


class Check(BaseModel):
    name: str
    passed: bool
    message: str
    skipped: bool = False
    seconds: float = 0.0


class GateResult(BaseModel):
    exit_code: int
    verdict: str
    checks: list[Check] = Field(default_factory=list)
    measured_capacity_rps: float | None = None


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
        p = _find_input(ref, gate_path.parent, given, what)
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


def format_result(r: GateResult, gate: GateFile, engine: str, knobs: dict) -> str:
    kn = ", ".join(f"{k}={v}" for k, v in knobs.items()) or "vLLM defaults"
    where = f"{gate.model} on {gate.gpu}" if gate.gpu else f"{gate.model} (GPU not named)"
    lines = [f"gate: {r.verdict}  {where} (engine {engine}); {kn}"]
    lines += [f"  [{'ok' if c.passed else 'FAIL'}] {c.message}" for c in r.checks]
    return "\n".join(lines)


def write_junit(r: GateResult, path: str | Path) -> Path:
    """JUnit XML, one test case per check, so any CI shows which part of the gate failed."""
    failures = sum(not c.passed and not c.skipped for c in r.checks)
    suite = ET.Element("testsuite", name="slo-tuner-gate", tests=str(len(r.checks)), failures=str(failures),
                       errors="1" if r.exit_code == 2 else "0", skipped=str(sum(c.skipped for c in r.checks)),
                       time=f"{sum(c.seconds for c in r.checks):.3f}")
    for c in r.checks:
        case = ET.SubElement(suite, "testcase", classname="slo-tuner.gate", name=c.name, time=f"{c.seconds:.3f}")
        if c.skipped:
            ET.SubElement(case, "skipped", message=c.message)
        elif not c.passed:
            ET.SubElement(case, "failure", message=c.message).text = c.message
        else:
            ET.SubElement(case, "system-out").text = c.message
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tree = ET.ElementTree(ET.Element("testsuites", name="slo-tuner", tests=str(len(r.checks)),
                                     failures=str(failures)))
    tree.getroot().append(suite)
    ET.indent(tree)
    tree.write(p, encoding="utf-8", xml_declaration=True)
    return p


__all__ = ["GateFile", "GateResult", "write_gate", "load_gate", "run_gate", "format_result", "write_junit",
           "apply_overrides"]
