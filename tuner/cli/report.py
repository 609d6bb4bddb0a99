"""`tune report`, `tune plan`, `tune gate`: registered on the top-level app by `tuner.cli`.

Only option parsing lives here; the work is in `tuner.report`, `tuner.plan` and `tuner.gate`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from tuner.cli.needs import Needs, check_needs, flag_set
from tuner.errors import UserError
from tuner.settings import default


def report(run_dir: Path = typer.Argument(..., help="Run directory of `tune` (study.db or storage.txt)."),
           out: Optional[Path] = typer.Option(None, "--out", help="Write here instead of RUN_DIR."),
           ) -> None:
    """Rebuild report.md, report.html, report.json, tuned-config.yaml, gate.yaml and plots from the study
    storage. gate.yaml is rewritten too: the report says what it holds, and a gate kept from an older
    run of the tool (which gated fp8 KV for a gain inside the noise) would contradict it."""
    from tuner.gate import write_gate
    from tuner.inputs import check_out_dir
    from tuner.report import write_report
    from tuner.storage.reader import storage_url

    storage_url(run_dir)  # a run directory of `tune`, checked before anything is created
    dest = check_out_dir(out, "--out") if out is not None else run_dir
    dest.mkdir(parents=True, exist_ok=True)  # the gate before the report, which says what it holds
    if write_gate(run_dir, path=dest / "gate.yaml") is None:  # nothing met the SLO: no gate to keep
        (dest / "gate.yaml").unlink(missing_ok=True)
    rep = write_report(run_dir, out)
    where = out or run_dir
    b = rep.baseline.capacity_rps
    print(f"{rep.title}")
    print(f"baseline: {f'{b:.3g} req/s' if b is not None else 'n/a'}")
    r = rep.recommendation  # the decision the headline, tuned-config.yaml and gate.yaml carry
    if r is not None:
        print(r.line())
        if r.best_line():
            print(r.best_line())
    print(f"wrote {where}/report.html, report.md, report.json, tuned-config.yaml, gate.yaml")


#: `tune plan`'s options that act only beside another (`tuner.cli.needs`)
PLAN_NEEDS: Needs = {
    **{f: ("--verify", flag_set("verify")) for f in (
        "--policy", "--replicas", "--cold-start-s", "--surge-s", "--session-key", "--arrivals", "--fleet-out",
        "--export", "--workload", "--real-router")},
    **{f: ("--real-router", flag_set("real_router")) for f in (
        "--real-duration", "--real-replicas", "--time-scale", "--stop-replica-at")},
}


def plan(ctx: typer.Context,
         run_dir: Optional[Path] = typer.Argument(None, help="Run directory (optional: or give numbers)."),
         rate_per_instance: Optional[float] = typer.Option(None, "--rate-per-instance",
                                                           help="Measured knee of one instance, req/s."),
         tokens_per_s: Optional[float] = typer.Option(None, "--tokens-per-s",
                                                      help="Knee output throughput (tokens/s); with "
                                                           "--mean-output-tokens gives the rate per instance."),
         peak_rate: Optional[float] = typer.Option(None, "--peak-rate", help="Peak req/s to serve."),
         headroom: Optional[float] = typer.Option(None, "--headroom", help="Target utilisation (default 0.7)."),
         tp: int = typer.Option(1, "--tp", help="Tensor-parallel GPUs per instance."),
         gpu: Optional[str] = typer.Option(None, "--gpu"),
         model: Optional[str] = typer.Option(None, "--model"),
         slo_file: Optional[Path] = typer.Option(None, "--slo", help="SLO YAML (thresholds for the "
                                                                    "floors, peak rate, headroom, price)."),
         price: Optional[float] = typer.Option(None, "--price-per-gpu-hour"),
         mean_prompt: Optional[float] = typer.Option(None, "--mean-prompt-tokens"),
         mean_output: Optional[float] = typer.Option(None, "--mean-output-tokens"),
         quantization: Optional[str] = typer.Option(None, "--quantization"),
         as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
         verify: bool = typer.Option(False, "--verify", help="Prove the plan on a simulated fleet (RUN needed): "
                                     "N per routing policy, one replica down, 2x surge, cold start, autoscaling."),
         policy: list[str] = typer.Option([], "--policy", help="--verify: a vLLM Router policy (repeatable; "
                                          "default round_robin and cache_aware)."),
         replicas: Optional[int] = typer.Option(None, "--replicas", help="--verify: start the N search here."),
         cold_start_s: Optional[float] = typer.Option(None, "--cold-start-s", help="--verify: a replica's "
                                                      "launch time (default: the study's measured launches)."),
         surge_s: float = typer.Option(60.0, "--surge-s", help="--verify: seconds of the 2x surge."),
         session_key: str = typer.Option("tenant", "--session-key", help="--verify: tenant | prefix | none."),
         arrivals: str = typer.Option("poisson", "--arrivals", help="--verify: poisson | trace."),
         fleet_out: Optional[Path] = typer.Option(None, "--fleet-out", help="--verify: output folder "
                                                  "(default RUN/fleet)."),
         export: bool = typer.Option(False, "--export", help="--verify: also write Helm values, a KEDA "
                                     "ScaledObject and the vLLM Router's command line."),
         fleet_workload: Optional[str] = typer.Option(None, "--workload", help="--verify: the workload file "
                                                      "(default: the study's)."),
         real_router: bool = typer.Option(False, "--real-router", help="--verify: then run each policy's "
                                          "verified fleet in real time through the vLLM Router (the `fleet` "
                                          "extra) in front of HTTP-simulator replicas; real beside virtual."),
         real_duration: float = typer.Option(20.0, "--real-duration", help="--real-router: seconds of load "
                                             "at the peak (schedule seconds; wall = this x --time-scale)."),
         real_replicas: Optional[int] = typer.Option(None, "--real-replicas", help="--real-router: replicas "
                                                     "(default: each policy's verified N)."),
         time_scale: float = typer.Option(1.0, "--time-scale", help="--real-router: the simulated GPUs run "
                                          "this many times slower, so a small host keeps up."),
         stop_replica_at: Optional[float] = typer.Option(None, "--stop-replica-at", help="--real-router: "
                                                         "stop replica 0 this many seconds into the run."),
         ) -> None:
    """Instances and GPUs for a peak rate: feasibility, memory gate, speed gate, N+1, cost.

    Exit code 1 when the SLO is infeasible on the hardware (a threshold below its single-stream floor, or
    requests longer than the model's context); 3 or 4 for a run that measured no capacity (as `tune`)."""
    check_needs(ctx, PLAN_NEEDS)
    if verify:
        from tuner.cli.fleet import RealRouterOptions, run_verify

        return run_verify(run_dir, policies=policy, replicas=replicas, cold_start_s=cold_start_s,
                          surge_s=surge_s, price=price, out=fleet_out, session_key=session_key,
                          arrivals=arrivals, seed=0, workload=fleet_workload, export=export,
                          peak_rate=peak_rate,
                          real=RealRouterOptions(duration_s=real_duration, replicas=real_replicas,
                                                 time_scale=time_scale, stop_replica_at=stop_replica_at)
                          if real_router else None)
    from tuner.plan import format_plan

    p = _plan(run_dir, rate_per_instance=rate_per_instance, tokens_per_s=tokens_per_s, peak_rate=peak_rate,
              headroom=headroom, tp=tp, gpu=gpu, model=model, slo_file=slo_file, price=price,
              mean_prompt=mean_prompt, mean_output=mean_output, quantization=quantization)
    print(p.model_dump_json(indent=2) if as_json else format_plan(p))
    if not p.feasible:
        sys.exit(1)  # not typer.Exit: the app runs with standalone_mode=False, which returns its code


def _plan(run_dir: Path | None, *, rate_per_instance: float | None, tokens_per_s: float | None,
          peak_rate: float | None, headroom: float | None, tp: int, gpu: str | None, model: str | None,
          slo_file: Path | None, price: float | None, mean_prompt: float | None, mean_output: float | None,
          quantization: str | None):
    """`tune plan`'s plan from its options: the run directory's measured capacity, or the numbers given
    (checked first, each in a finite range); exits with the study's code for a run that measured none."""
    from tuner.knobs import Knobs
    from tuner.plan import make_plan, plan_from_run
    from tuner.search.space import knob_value_error
    from tuner.slo import load_slo

    for name, v in [("--tokens-per-s", tokens_per_s), ("--mean-output-tokens", mean_output),
                    ("--mean-prompt-tokens", mean_prompt)]:
        if v is not None and not (v > 0 and v != float("inf")):
            raise UserError(f"must be a number > 0, got {v}", field=name)
    for name, v in [("--rate-per-instance", rate_per_instance), ("--tokens-per-s", tokens_per_s),
                    ("--peak-rate", peak_rate), ("--mean-output-tokens", mean_output),
                    ("--mean-prompt-tokens", mean_prompt), ("--price-per-gpu-hour", price)]:
        # a finite range: 1e-300 req/s per instance against a 1e300 peak is an infinite replica count
        if v is not None and v == v and v != 0 and not PLAN_MIN <= abs(v) <= PLAN_MAX:
            raise UserError(f"must be between {PLAN_MIN:g} and {PLAN_MAX:g}, got {v:g}", field=name)
    if quantization is not None and knob_value_error("quantization", quantization):
        raise UserError(knob_value_error("quantization", quantization) or "", field="--quantization")
    slo = load_slo(slo_file) if slo_file else None
    if tokens_per_s is not None:
        if not mean_output:
            raise UserError("needs --mean-output-tokens (rate = tokens/s / mean output tokens)",
                            field="--tokens-per-s")
        rate_per_instance = tokens_per_s / mean_output
    if run_dir is not None:
        from tuner.plan import NoCapacity

        try:
            p = plan_from_run(str(run_dir), rate_per_instance=rate_per_instance, peak_rate=peak_rate,
                              headroom=headroom, tp=tp if tp != 1 else None, gpu=gpu, model=model,
                              price_per_gpu_hour=price, mean_prompt_tokens=mean_prompt,
                              mean_output_tokens=mean_output)
        except NoCapacity as e:  # an empty result, not bad input: the study's own exit code (3 or 4)
            print(f"error: {e.message}", file=sys.stderr)
            sys.exit(e.exit_code)
    else:
        if rate_per_instance is None:
            raise UserError("give a run directory, or --rate-per-instance (or --tokens-per-s)",
                            field="--rate-per-instance")
        peak = peak_rate if peak_rate is not None else (slo.peak_rate if slo else None)
        if peak is None:
            raise UserError("give --peak-rate (or an SLO file with peak_rate)", field="--peak-rate")
        p = make_plan(rate_per_instance=rate_per_instance, peak_rate=peak,
                      headroom=headroom if headroom is not None else (slo.headroom if slo else 0.7),
                      tp=tp, gpu=gpu, model=model, slo=slo,
                      knobs=Knobs(quantization=quantization) if quantization else None,
                      price_per_gpu_hour=price if price is not None else (slo.price_per_gpu_hour if slo else None),
                      mean_prompt_tokens=mean_prompt, mean_output_tokens=mean_output)
    return p


def gate(gate_file: Path = typer.Argument(..., help="gate.yaml written by a tuning run."),
         engine: Optional[str] = typer.Option(None, "--engine", help="sim | sim-http | vllm (default: the "
                                                                     "engine the gate was measured on)."),
         override: list[str] = typer.Option([], "--config-override",
                                            help="knob=value over the gated knobs (repeatable)."),
         full: bool = typer.Option(False, "--full", help="Also re-measure the capacity (a knee search)."),
         allow_changed: bool = typer.Option(False, "--allow-changed",
                                            help="Compare even if the workload or SLO file changed."),
         workload: Optional[str] = typer.Option(None, "--workload", help="Workload file (default: recorded)."),
         slo: Optional[str] = typer.Option(None, "--slo", help="SLO file (default: recorded)."),
         junit: Optional[Path] = typer.Option(None, "--junit", help="Write JUnit XML here."),
         vllm_python: Optional[str] = typer.Option(None, help="vllm: interpreter of a venv with vLLM."),
         vllm_command: Optional[str] = typer.Option(None, help="vllm: launch template with {model} {port} "
                                                                "{host} {args}."),
         vllm_arg: Optional[list[str]] = typer.Option(
             None, "--vllm-arg", help="vllm, sim-http: one more server argument after the knobs (repeatable; "
             "write it with '='). Default: the ones the study used (recorded in gate.yaml); given, they "
             "replace those."),
         api_key: Optional[str] = typer.Option(None, envvar="VLLM_API_KEY", help="API key (env VLLM_API_KEY)."),
         time_scale: float = typer.Option(default("time_scale"),
                                          help="sim-http: simulated GPU runs this many times slower."),
         ) -> None:
    """Re-measure the gated configuration: exit 0 pass, 1 regression, 2 bad input."""
    from tuner.engine.registry import names as engine_names
    from tuner.gate import apply_overrides, format_result, load_gate, run_gate
    from tuner.inputs import check_out_file
    from tuner.settings import from_options

    # this host's engine options, validated as `tune`'s own are, before the gate's inputs are read
    host = from_options(dict(engine=engine, vllm_python=vllm_python, vllm_command=vllm_command, api_key=api_key,
                             time_scale=time_scale, vllm_arg=vllm_arg), known={"engine": engine_names()}).engine
    if junit is not None:
        check_out_file(junit, "--junit")
    g = load_gate(gate_file)
    res = run_gate(gate_file, overrides=override, full=full, allow_changed=allow_changed,
                   workload=workload, slo=slo, junit=junit, host=host)
    print(format_result(res, g, engine or g.engine, apply_overrides(g.knobs, override)))
    if junit:
        print(f"junit: {junit}")
    sys.stdout.flush()
    if res.exit_code:
        sys.exit(res.exit_code)


PLAN_MIN, PLAN_MAX = 1e-6, 1e9  # req/s, tokens/s, tokens, $/h: far beyond any real figure both ways


def register(app: typer.Typer) -> None:
    app.command("report")(report)
    app.command("plan")(plan)
    app.command("gate")(gate)


__all__ = ["register"]
