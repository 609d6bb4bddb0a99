"""`tune --workload W --slo S` (the main job), `tune worker` (scale-out on a shared database), and the
study's live progress on the terminal (`RichReporter`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from tuner.cli.needs import Needs, check_needs
from tuner.errors import UserError
from tuner.knobs import Knobs
from tuner.storage.records import LoadRunSummary, TrialRecord
from tuner.settings import WorkerOptions, default, default_of


def _sigterm_to_interrupt() -> None:
    """SIGINT and SIGTERM stop the study at the next safe point, whatever they land in (`tuner.signals`):
    the server is stopped and the trial recorded as interrupted."""
    from tuner import signals

    signals.install()


VLLM_ARG_HELP = ("vllm, sim-http: one more `vllm serve` argument, after the knobs (repeatable); write it "
                 "with '=': --vllm-arg=--enforce-eager --vllm-arg=--kv-cache-memory-bytes=4194304")


#: `tune`'s options that act only beside another (`tuner.cli.needs`)
TUNE_NEEDS: Needs = {
    "--vllm-python": ("--engine vllm", lambda p: p.get("engine") == "vllm"),
    "--vllm-command": ("--engine vllm", lambda p: p.get("engine") == "vllm"),
    "--time-scale": ("--engine sim-http", lambda p: p.get("engine") == "sim-http"),
}


def tune(
    ctx: typer.Context,
    workload: Optional[Path] = typer.Option(None, "--workload", "-w", help="Workload file (any supported format)."),
    slo: Optional[Path] = typer.Option(None, "--slo", "-s", help="SLO YAML file."),
    engine: str = typer.Option(default("engine"), help="sim (in-process simulator) | sim-http | vllm."),
    gpu: Optional[str] = typer.Option(None, help="GPU profile (simulated engines; optional for vllm)."),
    model: Optional[str] = typer.Option(None, help="Model: profile name, config.json path, or what vllm serves."),
    search_space: str = typer.Option(default("search_space"), help="Built-in space name or a YAML file."),
    lora_dir: Optional[str] = typer.Option(None, "--lora-dir", help="The LoRA adapters the workload's "
                                           "requests name: a folder of adapter folders (adapter_config.json "
                                           "+ weights), or a YAML catalog of names and ranks (simulated "
                                           "engines). The server is launched with LoRA on and them listed."),
    strategy: str = typer.Option(
        default("strategy"), help="auto (twin where --gpu and --model name known profiles, else guided) | twin (rank the space in a simulator fitted to this engine's launches; verify its best) | guided | tpe | random | grid."),
    max_trials: int = typer.Option(default("max_trials"), help="Engine launches at most (the baseline included)."),
    confirm: bool = typer.Option(default("confirm"), help="Launch the baseline and every new incumbent twice and "
                                 "keep the lower capacity (guards against a lucky launch; off: one launch "
                                 "per configuration)."),
    attribute: bool = typer.Option(default("attribute"), help="Measure each knob's share of a step that changed "
                                   "several knobs: one launch per knob, with that knob left out (without it "
                                   "the shares are the fitted twin's predictions, labelled so)."),
    windows: Optional[int] = typer.Option(default("windows"), help="Decide the recommendation on common "
                                          "request windows (paired, with intervals; every knob earned by a "
                                          "measurement): this many windows a configuration at most, one "
                                          "launch a configuration beyond --max-trials. 0: off (the knee "
                                          "searches' capacities and the noise floor decide). Default: 12 on "
                                          "the in-process simulator, off on real-time engines."),
    drop_overlong: bool = typer.Option(default("drop_overlong"), "--drop-overlong", help="Leave out (and count) "
                                       "the requests whose prompt + output exceed the model's context: "
                                       "vLLM refuses them, so they can never meet the SLO."),
    time_budget: Optional[float] = typer.Option(None, help="Stop starting trials after this many seconds."),
    out: Optional[Path] = typer.Option(None, help="Run directory (default runs/<timestamp>)."),
    storage: Optional[str] = typer.Option(None, help="Optuna storage URL (default: SQLite in --out)."),
    resume: bool = typer.Option(default("resume"), help="Continue the study in --out."),
    json_out: bool = typer.Option(default("json_out"), "--json",
                                  help="Print report.json (or a summary) to stdout."),
    seed: int = typer.Option(default("seed")),
    precision: float = typer.Option(default("precision"), help="Capacity precision of each knee search."),
    noise_floor: Optional[float] = typer.Option(None, help="The gain a change must show to be recommended "
                                                "(a fraction: 0.05 is 5%). Default: --precision."),
    plateau: int = typer.Option(default("plateau"), help="guided: stop after this many launches in a row "
                                "that found no better configuration."),
    start_rate: Optional[float] = typer.Option(None, help="First offered rate of the baseline (req/s)."),
    requests_per_run: Optional[int] = typer.Option(None, help="Requests per load run."),
    max_run_s: Optional[float] = typer.Option(None, help="Cap on a real-time load run's span (s)."),
    arrival: str = typer.Option(default("arrival"), help="poisson | gamma | trace."),
    noise: float = typer.Option(default("noise"), help="Simulator run-to-run noise (sigma, e.g. 0.03)."),
    time_scale: float = typer.Option(default("time_scale"),
                                     help="sim-http: simulated GPU runs this many times slower."),
    vllm_python: Optional[str] = typer.Option(None, help="vllm: interpreter of a venv with vLLM."),
    vllm_command: Optional[str] = typer.Option(None, help="vllm: launch template with {model} {port} {host} {args}."),
    vllm_arg: Optional[list[str]] = typer.Option(None, "--vllm-arg", help=VLLM_ARG_HELP),
    api_key: Optional[str] = typer.Option(None, envvar="VLLM_API_KEY", help="API key (env VLLM_API_KEY)."),
    devices: Optional[str] = typer.Option(None, help="Run trials side by side on disjoint sets of these "
                                          "devices (GPU ids, or CPU cores with --device-kind cpu): "
                                          "'0-7' or '0,1,2,3'. Default with --set-size: all of the host's."),
    set_size: Optional[int] = typer.Option(None, help="Devices in each set (default: the most GPUs a "
                                           "layout of the search space needs, else 1)."),
    device_sets: Optional[str] = typer.Option(None, help="The sets themselves, ';' between sets: '0,1;2,3'."),
    device_kind: Optional[str] = typer.Option(None, help="gpu (CUDA_VISIBLE_DEVICES) | cpu (CPU affinity; "
                                              "vllm-cpu and the simulators). Default: gpu for --engine "
                                              "vllm on a host with GPUs, else cpu."),
) -> None:
    """Tune vllm serve for the most traffic inside the SLO; writes report, plan and gate to --out."""
    if ctx.invoked_subcommand is not None:
        return
    _run_study(ctx, workload, slo, out, storage, resume)


def _run_study(ctx: typer.Context, workload: Path | None, slo: Path | None, out: Path | None, storage: str | None,
               resume: bool) -> None:
    """`tune`'s study, from its options (`ctx.params`, all of them, by name): run, summarised on the
    terminal, and exited with the study's code when it found no result (130 when interrupted)."""
    if workload is None or slo is None:
        raise UserError("give --workload and --slo (see tune --help)",
                        field="--workload" if workload is None else "--slo")
    check_needs(ctx, TUNE_NEEDS)
    from tuner.preflight import keep_only_saved
    from tuner.study import run_tune, settings_from_options

    import time as _t
    run_dir = out or Path("runs") / _t.strftime("%Y%m%d-%H%M%S")
    # every option of `tune`, by name, into the run's settings (`tuner.settings.OPTIONS` maps each one)
    settings = settings_from_options({**ctx.params, "out": run_dir})
    _sigterm_to_interrupt()
    reporter = RichReporter()
    kept: dict = {}
    try:
        with keep_only_saved(run_dir, resume=resume, own_storage=storage is None, state=kept):
            outcome, run_dir = run_tune(settings, reporter)
    except KeyboardInterrupt:
        if kept.get("removed"):
            print("interrupted before the study was created: nothing was saved", file=sys.stderr)
        else:
            print(f"interrupted: the study is saved; continue with: {_resume_command(run_dir)}",
                  file=sys.stderr)
        sys.exit(130)  # not typer.Exit: with standalone_mode=False its code is returned, not used
    _summary(outcome, run_dir, settings.outputs.print_json)
    if outcome.status != "tuned":  # no result is not a result: a script or CI job must see it
        from tuner.storage.status import EXIT_CODES

        print(f"error: {outcome.status_text}", file=sys.stderr)
        sys.exit(EXIT_CODES[outcome.status])

def worker(
    out: Path = typer.Option(..., help="Run directory of the study (its storage.txt names the database)."),
    storage: Optional[str] = typer.Option(None, envvar="TUNER_STORAGE_URL",
                                          help="Optuna storage URL (default: from --out; env TUNER_STORAGE_URL)."),
    max_trials: Optional[int] = typer.Option(None, help="Stop after this many trials."),
    idle_exit: float = typer.Option(default_of(WorkerOptions, "idle_exit_s"),
                                    help="Exit after this many seconds with nothing to do."),
    vllm_python: Optional[str] = typer.Option(None),
    vllm_command: Optional[str] = typer.Option(None),
    vllm_arg: Optional[list[str]] = typer.Option(None, "--vllm-arg", help=VLLM_ARG_HELP),
    api_key: Optional[str] = typer.Option(None, envvar="VLLM_API_KEY"),
    device_set: Optional[str] = typer.Option(None, help="Run trials on these devices only (GPU ids, or "
                                             "CPU cores with --device-kind cpu): '0,1'."),
    devices: Optional[str] = typer.Option(None, help="Run one trial per set of these devices side by side "
                                          "(as tune's --devices): this worker and one more per set."),
    set_size: Optional[int] = typer.Option(None, help="Devices in each set (as tune's --set-size)."),
    device_sets: Optional[str] = typer.Option(None, help="The sets themselves: '0,1;2,3'."),
    device_kind: Optional[str] = typer.Option(None, help="gpu | cpu (default: gpu on a host with GPUs)."),
) -> None:
    """Work on a shared study: run the configurations queued in its storage until none are left."""
    from tuner.settings import from_options, worker_options
    from tuner.search.pool import pin_worker
    from tuner.study import run_worker

    # the worker's own limits, and what this host gives for the engine (the rest is the study's)
    options = worker_options(max_trials=max_trials, idle_exit=idle_exit)
    if device_set is not None and (devices or set_size or device_sets):
        raise UserError("one set (--device-set) or sets side by side (--devices, --set-size, --device-sets), "
                        "not both", field="--device-set")
    try:
        host = from_options(dict(out=out, storage=storage, vllm_python=vllm_python, vllm_command=vllm_command,
                                 vllm_arg=vllm_arg, api_key=api_key, devices=device_set or devices,
                                 set_size=set_size, device_sets=device_sets, device_kind=device_kind))
    except UserError as e:  # with one set, the worker's option for the devices is --device-set
        raise UserError(e.message, field="--device-set" if device_set and e.field == "--devices" else e.field) \
            from None
    # before the study is opened: a bad set creates nothing
    where = pin_worker(host.devices) if device_set is not None or host.devices.kind and not host.devices.given \
        else None
    _sigterm_to_interrupt()
    try:
        n = run_worker(out, host, options, device_set=where)
    except KeyboardInterrupt:
        print("worker interrupted; its trial is recorded and will be retried", file=sys.stderr)
        sys.exit(130)  # not typer.Exit: with standalone_mode=False its code is returned, not used
    print(f"worker done: {n} trials", file=sys.stderr)

def worker_job(
    out: Path = typer.Option(..., help="Run directory of a study on a shared database (storage.txt)."),
    image: str = typer.Option(..., help="Container image with slo-tuner and vLLM."),
    pods: int = typer.Option(2, min=1, max=4096, help="Workers side by side: one pod per device set."),
    gpus_per_pod: int = typer.Option(1, min=0, max=64, help="GPUs each pod requests (a device set's size)."),
    secret: str = typer.Option("slo-tuner-storage", help="Secret holding the storage URL."),
    secret_key: str = typer.Option("url", help="Key of the storage URL in --secret."),
    inputs_claim: str = typer.Option("slo-tuner-inputs", help="PersistentVolumeClaim holding the directory "
                                     "the study ran in (its workload and SLO), mounted read-only there."),
    name: str = typer.Option("slo-tuner-workers", help="The Job's name."),
    vllm_python: Optional[str] = typer.Option(None, help="The image's interpreter with vLLM, if not the "
                                              "study's."),
    file: Optional[Path] = typer.Option(None, "--file", help="Write the manifest here (default: stdout)."),
) -> None:
    """A Kubernetes Job of `tune worker` pods for a study on PostgreSQL, one pod per device set."""
    import yaml

    from tuner.search.k8s_job import worker_job as build
    from tuner.study import shared_study_info

    if file is not None and (file.exists() or not file.parent.is_dir()):
        raise UserError("exists already, or its folder does not" if file.exists() or file.parent.is_dir()
                        else "its folder does not exist", file=str(file), field="--file")
    info = shared_study_info(out)
    text = yaml.safe_dump(build(info, name=name, image=image, pods=pods, gpus_per_pod=gpus_per_pod,
                                secret=secret, secret_key=secret_key, inputs_claim=inputs_claim,
                                vllm_python=vllm_python), sort_keys=False)
    if file is None:
        sys.stdout.write(text)
    else:
        file.write_text(text)


def register(app: typer.Typer) -> None:
    app.callback(invoke_without_command=True)(tune)
    app.command()(worker)
    app.command("worker-job")(worker_job)


def _resume_command(run_dir: Path) -> str:
    """The command as it was typed (every option matters: space, strategy, load sizes), plus --resume and
    --out; an --api-key value is left out (VLLM_API_KEY in the environment still supplies it)."""
    import shlex

    args, skip = [], False
    for a in sys.argv[1:]:
        if skip or a.startswith("--api-key="):
            skip = False
            continue
        if a == "--api-key":
            skip = True
            continue
        args.append(a)
    if not any(a == "--out" or a.startswith("--out=") for a in args):
        args += ["--out", str(run_dir)]
    if "--resume" not in args:
        args.append("--resume")
    return shlex.join(["tune", *args])


def _summary(outcome, run_dir: Path, json_out: bool) -> None:
    """What the study found, in the report's own words: the baseline and tuned rows are read from
    `report.json` when it was written, so the terminal and the report name the same trials."""
    base, inc = outcome.baseline, outcome.incumbent
    rows = {"baseline": {"trial": base.number if base else None, "knobs": base.knobs if base else {},
                         "capacity_rps": base.capacity_rps if base else None},
            "tuned": {"trial": inc.number if inc else None, "knobs": inc.knobs if inc else {},
                      "capacity_rps": inc.capacity_rps if inc else None}}
    report_json = run_dir / "report.json"
    if report_json.exists():
        rep = json.loads(report_json.read_text())
        for k in rows:
            if rep.get(k):
                rows[k] = {f: rep[k].get(f) for f in ("trial", "knobs", "capacity_rps")}
    if json_out:
        if report_json.exists():
            sys.stdout.write(report_json.read_text())
        else:
            print(json.dumps({**rows, "stop_reason": outcome.stop_reason, "run_dir": str(run_dir)}, indent=2))
        return
    b, t = rows["baseline"]["capacity_rps"], rows["tuned"]["capacity_rps"]
    print(f"stopped: {outcome.stop_reason}")
    if outcome.status != "tuned":
        print(f"NO RESULT: {outcome.status_text}")
    elif report_json.exists() and rep.get("recommendation"):
        # the report's own decision (`tuner.recommend`): the lines its headline opens with
        from tuner.recommend import Recommendation

        r = Recommendation.model_validate(rep["recommendation"])
        print(r.baseline_line() or f"baseline (vLLM defaults, trial {rows['baseline']['trial']}): "
              f"{f'{b:.2f} req/s' if b else 'no rate met the SLO'}")
        print(r.line())
        if r.best_line():
            print(r.best_line())
    else:
        print(f"baseline (vLLM defaults, trial {rows['baseline']['trial']}): "
              f"{f'{b:.2f} req/s' if b else 'no rate met the SLO'}")
        knobs = rows["tuned"]["knobs"] or {}
        if not knobs or rows["tuned"]["trial"] == rows["baseline"]["trial"]:
            print("tuned: no configuration beat vLLM's defaults; keep them"
                  + (f" ({t:.2f} req/s)" if t else ""))
        else:
            gain = f" ({t / b - 1:+.0%})" if b and t else ""
            kn = " ".join(f"{k}={v}" for k, v in knobs.items())
            print(f"tuned (trial {rows['tuned']['trial']}): {f'{t:.2f} req/s' if t else 'no capacity'}{gain} "
                  f"with {kn}")
    for name in ("report.html", "report.md", "gate.yaml"):
        if (run_dir / name).exists():
            print(f"{name}: {run_dir / name}")
    print(f"run directory: {run_dir}")


# -- live progress on the terminal: the trial, its knobs, each load run, the incumbent ---------------
def _knobs(k: dict) -> str:
    return " ".join(f"{n}={v}" for n, v in k.items()) or "vLLM defaults"


class RichReporter:
    """One line per load run and per trial, with a status spinner while a trial runs (stderr)."""

    def __init__(self, console: Console | None = None):
        # soft_wrap: a line longer than the terminal (or than 80 columns in a log file) stays one line
        self.console = console or Console(stderr=True, soft_wrap=True)
        self.incumbent: TrialRecord | None = None
        self._status: Any = None  # the spinner of the trial under way (rich's Status)

    def trial_started(self, number: int, knobs: Knobs, role: str) -> None:
        self.console.print(f"[bold]trial {number}[/] [dim]({role})[/] {_knobs(knobs.set_only())}")
        self._status = self.console.status(f"trial {number}: launching", spinner="dots")
        self._status.start()

    def point(self, number: int, p: LoadRunSummary) -> None:
        mark = "[green]pass[/]" if p.passed else "[yellow]unproven[/]" if p.verdict == "too_short" else \
            "[yellow]not the server's[/]" if p.verdict == "client_bound" else "[red]fail[/]"
        p99 = ", ".join(f"{m} {v:.0f}" for m, v in p.p99_ms.items() if v is not None and m != "itl")
        rate = "burst (all at once)" if p.rate >= 1e5 else f"{p.rate:8.2f} req/s"
        why = {"overloaded": "overloaded", "too_short": "too short to tell", "errors": "errors"}.get(p.verdict)
        served = f" served {p.served_rps:.3g}/s" if p.served_rps is not None and p.rate < 1e5 else ""
        if p.rate >= 1e5:  # the burst: a bound for the search, not a point of the knee curve
            thr = f"{p.throughput_rps:.3g} req/s" if p.throughput_rps else "not measured"
            mark, served = "[dim]maximum throughput[/]", f" {thr}"
        self.console.print(f"   {rate}  {mark}{f' ({why})' if why else ''}  n={p.n}{served}  attainment "
                           f"{p.attainment:.3f} [{p.ci_low:.3f}, {p.ci_high:.3f}]  p99 ms: {p99}")
        causes = ", ".join(f"{k} {v}" for k, v in p.errors_by_cause.items())
        if causes:
            self.console.print(f"      [yellow]errors:[/] {causes}")
        for w in p.warnings:
            self.console.print(f"      [yellow]warning:[/] {w[:200]}")
        for c in p.client_bound_runs:
            self.console.print(f"      [yellow]run again, client-bound:[/] {'; '.join(c.reasons)[:240]}")
        if p.client_check is not None and p.client_check.server_ttft_mean_ms is not None:
            self.console.print(f"      [dim]server's own view: {p.client_check.line()[:240]}[/]")
        if self._status:
            inc = self.incumbent.capacity_rps if self.incumbent and self.incumbent.capacity_rps else None
            self._status.update(f"trial {number}: last load run {rate.strip()}, "
                                f"attainment {p.attainment:.3f}; incumbent "
                                f"{f'{inc:.2f} req/s' if inc else '-'}")

    def trial_done(self, rec: TrialRecord) -> None:
        if self._status:
            self._status.stop()
            self._status = None
        what = {"requests_failed": "its requests failed", "ruled_out": "not launched",
                "client_bound": "not measured (the client's timings, not the server's)"}
        if rec.launch_failure_kind:
            self.console.print(f"   [yellow]{what.get(rec.launch_failure_kind, 'launch failed')}[/] "
                               f"({rec.launch_failure_kind}): {(rec.launch_failure_message or '')[:200]}")
            for c in rec.learned:
                self.console.print(f"   [cyan]learned[/]: {c.text()}")
        elif rec.interrupted:
            self.console.print("   [yellow]interrupted[/]")
        elif rec.raced_out:
            self.console.print("   [dim]raced out: fails at the incumbent's capacity[/]")
        else:
            cap = f"{rec.capacity_rps:.2f} req/s" if rec.capacity_rps else "none"
            if rec.capacity_rps:
                lo, hi = rec.capacity_low_rps, rec.capacity_high_rps
                cap += (f" (passed clearly at {lo:.3g}" if lo else " (no clear pass") + (
                    f", failed clearly at {hi:.3g})" if hi else ")")
            elif rec.no_capacity_reason:
                cap += f": {rec.no_capacity_reason}"
            diag = f"; binds: {rec.diagnosis.kind} ({rec.diagnosis.summary})" if rec.diagnosis else ""
            if rec.diagnosis and rec.no_capacity_reason and rec.diagnosis.summary in rec.no_capacity_reason:
                diag = f"; binds: {rec.diagnosis.kind}"  # the reason says it already
            beat = " [green]beats the incumbent[/]" if rec.accepted and rec.role == "candidate" else ""
            self.console.print(f"   capacity {cap}{beat}{diag}")
        if rec.quality is not None and rec.quality.status != "reference":
            self.console.print(f"   output quality vs vLLM's defaults: {rec.quality.line()}")

    def note(self, text: str) -> None:
        """A line about the search itself (the twin's fits and rankings), between trials."""
        self.console.print(f"   [cyan]{text}[/]")

    def incumbent_changed(self, rec: TrialRecord) -> None:
        cap = f"{rec.capacity_rps:.2f} req/s" if rec.capacity_rps else "none"
        self.console.print(f"   [green]incumbent[/]: trial {rec.number}, {_knobs(rec.knobs)}, {cap}")
        self.incumbent = rec
