"""`tune --workload W --slo S` (the main job) and `tune worker` (scale-out on a shared database)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from tuner.errors import UserError


def _sigterm_to_interrupt() -> None:
    """SIGINT and SIGTERM stop the study at the next safe point, whatever they land in (`tuner.signals`):
    the server is stopped and the trial recorded as interrupted."""
    from tuner import signals

    signals.install()


VLLM_ARG_HELP = ("vllm, sim-http: one more `vllm serve` argument, after the knobs (repeatable); write it "
                 "with '=': --vllm-arg=--enforce-eager --vllm-arg=--kv-cache-memory-bytes=4194304")


def register(app: typer.Typer) -> None:
    @app.callback(invoke_without_command=True)
    def tune(
        ctx: typer.Context,
        workload: Optional[Path] = typer.Option(None, "--workload", "-w", help="Workload file (any supported format)."),
        slo: Optional[Path] = typer.Option(None, "--slo", "-s", help="SLO YAML file."),
        engine: str = typer.Option("sim", help="sim (in-process simulator) | sim-http | vllm."),
        gpu: Optional[str] = typer.Option(None, help="GPU profile (simulated engines; optional for vllm)."),
        model: Optional[str] = typer.Option(None, help="Model: profile name, config.json path, or what vllm serves."),
        search_space: str = typer.Option("default", help="Built-in space name or a YAML file."),
        strategy: str = typer.Option("auto", help="auto (twin where --gpu and --model name known profiles, else guided) | twin (rank the space in a simulator fitted to this engine's launches; verify its best) | guided | tpe | random | grid."),
        max_trials: int = typer.Option(15, help="Engine launches at most (the baseline included)."),
        confirm: bool = typer.Option(True, help="Launch the baseline and every new incumbent twice and keep "
                                     "the lower capacity (guards against a lucky launch; off: one launch "
                                     "per configuration)."),
        attribute: bool = typer.Option(False, help="Measure each knob's share of a step that changed several "
                                       "knobs: one launch per knob, with that knob left out (without it the "
                                       "shares are the fitted twin's predictions, labelled so)."),
        drop_overlong: bool = typer.Option(False, "--drop-overlong", help="Leave out (and count) the "
                                           "requests whose prompt + output exceed the model's context: "
                                           "vLLM refuses them, so they can never meet the SLO."),
        time_budget: Optional[float] = typer.Option(None, help="Stop starting trials after this many seconds."),
        out: Optional[Path] = typer.Option(None, help="Run directory (default runs/<timestamp>)."),
        storage: Optional[str] = typer.Option(None, help="Optuna storage URL (default: SQLite in --out)."),
        resume: bool = typer.Option(False, help="Continue the study in --out."),
        json_out: bool = typer.Option(False, "--json", help="Print report.json (or a summary) to stdout."),
        seed: int = typer.Option(0),
        precision: float = typer.Option(0.05, help="Capacity precision of each knee search."),
        start_rate: Optional[float] = typer.Option(None, help="First offered rate of the baseline (req/s)."),
        requests_per_run: Optional[int] = typer.Option(None, help="Requests per load run."),
        max_run_s: Optional[float] = typer.Option(None, help="Cap on a real-time load run's span (s)."),
        arrival: str = typer.Option("poisson", help="poisson | gamma | trace."),
        noise: float = typer.Option(0.0, help="Simulator run-to-run noise (sigma, e.g. 0.03)."),
        time_scale: float = typer.Option(1.0, help="sim-http: simulated GPU runs this many times slower."),
        vllm_python: Optional[str] = typer.Option(None, help="vllm: interpreter of a venv with vLLM."),
        vllm_command: Optional[str] = typer.Option(None, help="vllm: launch template with {model} {port} {host} {args}."),
        vllm_arg: Optional[list[str]] = typer.Option(None, "--vllm-arg", help=VLLM_ARG_HELP),
        api_key: Optional[str] = typer.Option(None, envvar="VLLM_API_KEY", help="API key (env VLLM_API_KEY)."),
    ) -> None:
        """Tune vllm serve for the most traffic inside the SLO; writes report, plan and gate to --out."""
        if ctx.invoked_subcommand is not None:
            return
        if workload is None or slo is None:
            raise UserError("give --workload and --slo (see tune --help)", field="--workload")
        from tuner.preflight import keep_only_saved
        from tuner.search.progress import RichReporter
        from tuner.study import TuneOptions, run_tune

        import time as _t
        run_dir = out or Path("runs") / _t.strftime("%Y%m%d-%H%M%S")
        opts = TuneOptions(workload=workload, slo=slo, out=run_dir, engine=engine, gpu=gpu, model=model,
                           search_space=search_space, strategy=strategy, max_trials=max_trials, confirm=confirm,
                           time_budget_s=time_budget, storage=storage, resume=resume, seed=seed,
                           precision=precision, start_rate=start_rate, requests_per_run=requests_per_run,
                           max_run_s=max_run_s, arrival=arrival, noise=noise, time_scale=time_scale,
                           drop_overlong=drop_overlong,
                           vllm_python=vllm_python, vllm_command=vllm_command, vllm_args=list(vllm_arg or []),
                           api_key=api_key, attribute=attribute)
        _sigterm_to_interrupt()
        reporter = RichReporter()
        kept: dict = {}
        try:
            with keep_only_saved(run_dir, resume=resume, own_storage=storage is None, state=kept):
                outcome, run_dir = run_tune(opts, reporter)
        except KeyboardInterrupt:
            if kept.get("removed"):
                print("interrupted before the study was created: nothing was saved", file=sys.stderr)
            else:
                print(f"interrupted: the study is saved; continue with: {_resume_command(run_dir)}",
                      file=sys.stderr)
            sys.exit(130)  # not typer.Exit: with standalone_mode=False its code is returned, not used
        _summary(outcome, run_dir, json_out)
        if outcome.status != "tuned":  # no result is not a result: a script or CI job must see it
            from tuner.storage.status import EXIT_CODES

            print(f"error: {outcome.status_text}", file=sys.stderr)
            sys.exit(EXIT_CODES[outcome.status])

    @app.command()
    def worker(
        out: Path = typer.Option(..., help="Run directory of the study (its storage.txt names the database)."),
        storage: Optional[str] = typer.Option(None, help="Optuna storage URL (default: from --out)."),
        max_trials: Optional[int] = typer.Option(None, help="Stop after this many trials."),
        idle_exit: float = typer.Option(10.0, help="Exit after this many seconds with nothing to do."),
        vllm_python: Optional[str] = typer.Option(None),
        vllm_command: Optional[str] = typer.Option(None),
        vllm_arg: Optional[list[str]] = typer.Option(None, "--vllm-arg", help=VLLM_ARG_HELP),
        api_key: Optional[str] = typer.Option(None, envvar="VLLM_API_KEY"),
    ) -> None:
        """Work on a shared study: run the configurations queued in its storage until none are left."""
        from tuner.limits import MAX_SECONDS, MAX_TRIALS
        from tuner.study import run_worker

        if max_trials is not None and not 1 <= max_trials <= MAX_TRIALS:
            raise UserError(f"must be 1..{MAX_TRIALS}, got {max_trials}", field="--max-trials")
        if not 0 <= idle_exit <= MAX_SECONDS:  # NaN too: no comparison holds
            raise UserError(f"must be a number of seconds 0..{MAX_SECONDS:g}, got {idle_exit}", field="--idle-exit")

        _sigterm_to_interrupt()
        try:
            n = run_worker(out, storage=storage, max_trials=max_trials, idle_exit_s=idle_exit,
                           vllm_python=vllm_python, vllm_command=vllm_command, vllm_args=list(vllm_arg or []),
                           api_key=api_key)
        except KeyboardInterrupt:
            print("worker interrupted; its trial is recorded and will be retried", file=sys.stderr)
            sys.exit(130)  # not typer.Exit: with standalone_mode=False its code is returned, not used
        print(f"worker done: {n} trials", file=sys.stderr)


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
        print(f"baseline (vLLM defaults, trial {rows['baseline']['trial']}): "
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
