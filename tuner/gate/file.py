"""The gate file: what `tune` writes beside its report (`write_gate`) and `tune gate` reads back
(`load_gate`), checked as strictly as the study that wrote it, and the overrides a CI run may give."""

from __future__ import annotations

import time
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tuner import __version__
from tuner.capacity.measure import LoadSettings, engine_load_settings
from tuner.engine.registry import engine_class, names as engine_names
from tuner.errors import UserError
from tuner.inputs import file_sha256, parse_yaml, read_text, yaml_line
from tuner.knobs import Knobs
from tuner.limits import MAX_RATE_RPS, MAX_SEED, check_load
from tuner.recommend import recommend_study
from tuner.settings import default
from tuner.slo import QualityBound
from tuner.speculative import check_rates
from tuner.storage.quality import ATTR, load_reference
from tuner.storage.reader import load_study_data
from tuner.validation import first_error

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
    bound: QualityBound   # the SLO's `quality:` as the study read it, checked again when the gate is loaded


class GateFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = Field(1, ge=1, le=1, strict=True)  # the one this tool writes and reads
    created_unix: float = 0.0
    tool_version: str = ""
    engine: str
    gpu: str | None = None
    model: str | None = None
    #: simulated engines: the study's launch-to-launch noise and its seed (`tuner.settings.EngineSettings`)
    noise: float = Field(default("noise"), ge=0, le=1, allow_inf_nan=False)
    seed: int = Field(default("seed"), ge=0, le=MAX_SEED, strict=True)
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

    @field_validator("spec_acceptance")
    @classmethod
    def _rates(cls, v: dict[str, float]) -> dict[str, float]:
        return check_rates(v)

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
        knobs = Knobs(**gate.knobs)
    except ValidationError as e:
        err = e.errors()[0]
        raise UserError(err["msg"], file=p, field="knobs." + ".".join(map(str, err["loc"]))) from None
    _same_launch(gate, knobs, p, root)
    return gate


def _same_launch(gate: GateFile, knobs: Knobs, p: Path, root) -> None:
    """The gate re-measures the launch the study measured: its `serve_args` are that launch's knobs' flags,
    then its `extra_args`, as `write_gate` wrote them. A hand edit of one without the other would gate a
    launch no study measured (a `max_num_seqs` that cannot launch reads as a regression, an edited
    `extra_args` as a pass): exit 2. A CI run that gates another configuration says so with
    `--config-override` or `--vllm-arg`."""
    expected = [*knobs.flags(), *gate.extra_args]
    if gate.serve_args and gate.serve_args != expected:
        tail = gate.serve_args[len(gate.serve_args) - len(gate.extra_args):] if gate.extra_args else []
        field = "knobs" if tail == gate.extra_args else "extra_args"
        raise UserError("the gate's knobs and extra_args do not make its serve_args (edited by hand?): it would "
                        "gate a launch the study never measured; regenerate it with `tune report RUN`, or gate "
                        "another configuration with --config-override / --vllm-arg", file=p,
                        line=yaml_line(root, [field]), field=field)


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


def find_input(ref: FileRef, gate_dir: Path, given: str | None, what: str) -> Path:
    """The file as given on the command line, else as recorded (absolute, then relative to the current
    directory, then to the gate file's directory: a committed gate travels with its repository)."""
    cands = [Path(given)] if given else [Path(ref.path)]
    if not given and not Path(ref.path).is_absolute():
        cands.append(gate_dir / ref.path)
    for c in cands:
        if c.is_file():
            return c
    raise UserError(f"{what} file not found (recorded as {ref.path}; pass --{what} PATH)", field=f"--{what}")


