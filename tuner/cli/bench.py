"""`tune bench --url URL --workload W`: one `vllm bench serve`-style load run against a running server.

Option parsing and printing only; the run is `tuner.replay.client.run_load_http`, the statistics
`tuner.bench.result`. Every input is checked before the first request goes out, so a mistake costs no
load on the server and leaves no `--json` file behind.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Optional

import typer

from tuner.cli.needs import Needs, check_needs, flag_set
from tuner.errors import UserError

ARRIVALS = ("poisson", "gamma", "trace")


def _percentiles(text: str) -> list[float]:
    try:
        out = [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise UserError(f"must be comma-separated numbers, got {text!r}", field="--metric-percentiles") from None
    if not out or not all(0 < p <= 100 for p in out):
        raise UserError(f"each percentile must be in (0, 100], got {text!r}", field="--metric-percentiles")
    return out


def _check(rate: float | None, arrival: str, burstiness: float, max_concurrency: int | None,
           json_out: Path | None) -> float:
    """The rate to run at (vLLM's default: inf, a burst); raises `UserError` on any bad option."""
    if arrival not in ARRIVALS:
        raise UserError(f"unknown arrival process {arrival!r} (known: {', '.join(ARRIVALS)})", field="--arrival")
    if rate is None:
        rate = math.inf
    if math.isnan(rate) or rate <= 0:
        raise UserError(f"must be a number > 0 req/s or inf, got {rate}", field="--request-rate")
    if not (math.isfinite(burstiness) and burstiness > 0):
        raise UserError(f"must be a finite number > 0, got {burstiness}", field="--burstiness")
    if rate != math.inf and rate > 1e6:
        raise UserError(f"must be at most 1000000 req/s or inf, got {rate}", field="--request-rate")
    if max_concurrency is not None and max_concurrency < 1:
        raise UserError(f"must be >= 1, got {max_concurrency}", field="--max-concurrency")
    if json_out is not None:  # a folder, or a path under a file, fails here and not after the whole run
        from tuner.inputs import check_out_file

        if not json_out.expanduser().parent.is_dir():
            raise UserError("its folder does not exist", file=json_out, field="--json")
        check_out_file(json_out, "--json")
    return rate


def _check_counts(num_prompts: int, seed: int, request_timeout: float, save_run: Path | None) -> None:
    """The run's size and limits, in the ranges `tune` itself allows (`tuner.limits`)."""
    from tuner.limits import MAX_REQUESTS, MAX_SECONDS, MAX_SEED

    if not 1 <= num_prompts <= MAX_REQUESTS:
        raise UserError(f"must be 1..{MAX_REQUESTS}, got {num_prompts}", field="--num-prompts")
    if not 0 <= seed <= MAX_SEED:
        raise UserError(f"must be 0..{MAX_SEED}, got {seed}", field="--seed")
    if not (math.isfinite(request_timeout) and 0 < request_timeout <= MAX_SECONDS):
        raise UserError(f"must be a finite number of seconds > 0, got {request_timeout}", field="--request-timeout")
    if save_run is not None:
        from tuner.inputs import check_out_dir

        if save_run.exists():
            raise UserError("already exists: give a new folder", file=save_run, field="--save-run")
        check_out_dir(save_run, "--save-run")


def _adapters(values: list[str] | None, assignment: str) -> list[str]:
    """`--lora-modules` names (repeatable, each also comma-separated), one name once."""
    from tuner.bench.result import LORA_ASSIGNMENTS

    if assignment not in LORA_ASSIGNMENTS:
        raise UserError(f"must be one of {', '.join(LORA_ASSIGNMENTS)}, got {assignment!r}",
                        field="--lora-assignment")
    names = [n.strip() for v in values or [] for n in v.split(",") if n.strip()]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"adapter {twice[0]!r} is given twice", field="--lora-modules")
    return names


def _check_served(served: list[str], adapters: list[str], requests, workload: Path) -> None:
    """Every adapter a request will name is one the server lists in /v1/models (vLLM lists each
    `--lora-modules` adapter there): a name it does not serve would make every such request a 404."""
    for name in adapters:
        if name not in served:
            raise UserError(f"the server does not serve adapter {name!r} (it serves: {', '.join(served)})",
                            field="--lora-modules")
    for r in requests:
        if r.lora is not None and r.lora not in served:
            raise UserError(f"a request names adapter {r.lora!r}, which the server does not serve (it serves: "
                            f"{', '.join(served)})", file=workload, field="lora")


def _served(url: str, api_key: str | None) -> list[str]:
    """The model and adapter names `/v1/models` lists; also the check that `--url` serves."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(url.rstrip("/") + "/v1/models", headers=headers, timeout=30)
        r.raise_for_status()
        cards = r.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError) as e:
        raise UserError(f"cannot read {url.rstrip('/')}/v1/models: {e}", field="--url") from None
    return [str(c.get("id")) for c in cards if isinstance(c, dict)]


def _model_of(names: list[str], model: str | None) -> str:
    """The model to ask for: `--model`, else the server's first."""
    if model is not None:
        if model not in names:
            raise UserError(f"the server does not serve {model!r} (it serves: {', '.join(map(str, names))})",
                            field="--model")
        return model
    if not names:
        raise UserError("the server lists no model in /v1/models", field="--url")
    return names[0]


def _schedule_line(reqs, url: str, name: str, adapters: list[str], lora_assignment: str, rate: float, arrival: str,
               max_concurrency: int | None) -> str:
    """What the run will send, said before it starts: how many requests, where, which adapters, at what
    pace."""
    n_adapters = len({r.lora for r in reqs if r.lora})
    return (f"{len(reqs)} requests to {url} ({name}"
            + (f"; {n_adapters} LoRA adapters, {lora_assignment if adapters else 'as the workload names them'}"
               if n_adapters else "") + "), "
            + (f"rate {rate:g} req/s {arrival}" if math.isfinite(rate) else
               "the trace's timestamps" if arrival == "trace" else "rate inf")
            + (f", at most {max_concurrency} in flight" if max_concurrency else ""))


def _print_result(run, res, check, percentiles: list[float]) -> None:
    """The client's warnings (stderr), then `vllm bench serve`'s table and the server-side check that
    tells a slow server from a client that waited for a CPU."""
    from tuner.bench.result import format_table

    for w in run.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(format_table(res, percentiles))
    print(f"{'Server-side check':-^50}")
    print(check.line() or "(the server exports no latency histograms)")
    if check.client_bound:
        print("CLIENT-BOUND: these timings are the client's, not the server's: " + "; ".join(check.reasons)
              + " (docs/measurement.md, 'Who gets the CPU')")


#: `tune bench`'s options that act only beside another (`tuner.cli.needs`)
BENCH_NEEDS: Needs = {"--lora-assignment": ("--lora-modules", flag_set("lora_modules"))}


def bench(
    ctx: typer.Context,
    url: str = typer.Option(..., "--url", help="Base URL of the running server, e.g. http://127.0.0.1:8000."),
    workload: Path = typer.Option(..., "--workload", "-w", help="Workload file (any supported format)."),
    model: Optional[str] = typer.Option(None, help="Model to request (default: the server's first)."),
    api: str = typer.Option("completions", help="completions | chat."),
    request_rate: Optional[float] = typer.Option(None, "--request-rate", "--rate",
                                                 help="Requests per second, or inf (default: inf, a burst)."),
    arrival: str = typer.Option("poisson", help="poisson | gamma | trace (the workload's own timestamps; "
                                "rescaled to --request-rate if given)."),
    burstiness: float = typer.Option(1.0, help="gamma: shape of the gaps (1 = Poisson, < 1 burstier)."),
    max_concurrency: Optional[int] = typer.Option(None, help="Closed loop: at most this many requests in "
                                                  "flight; a send waits for a free slot."),
    num_prompts: int = typer.Option(1000, help="Requests to send (the workload's first, cycled)."),
    seed: int = typer.Option(0, help="Seed of the arrival draws."),
    slo: Optional[Path] = typer.Option(None, help="SLO YAML: also report goodput (good requests / duration)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the result here (vLLM's key names)."),
    save_run: Optional[Path] = typer.Option(None, "--save-run", help="Keep every request's record in this new "
                                            "folder (records.jsonl + summary.json: re-score it later)."),
    metric_percentiles: str = typer.Option("99", help="Comma-separated percentiles to report (vLLM's default 99)."),
    request_timeout: float = typer.Option(600.0, help="Seconds before a request counts as failed."),
    api_key: Optional[str] = typer.Option(None, envvar="VLLM_API_KEY", help="API key (env VLLM_API_KEY)."),
    lora_modules: Optional[list[str]] = typer.Option(
        None, "--lora-modules", help="LoRA adapters the server serves (repeat it, or comma-separate names): "
        "each request is sent to one, as `vllm bench serve --lora-modules` does (default: each request's own "
        "`lora`, else the base model)."),
    lora_assignment: str = typer.Option("random", "--lora-assignment",
                                        help="random | round-robin: how --lora-modules are given to requests."),
) -> None:
    """One load run against a running server, printed as `vllm bench serve` prints it."""
    from tuner.bench.result import assign_adapters, bench_result, bench_schedule
    from tuner.replay.check import bound_ms, check_run
    from tuner.replay.client import run_load_http
    from tuner.slo import load_slo
    from tuner.workload.loader import load_workload

    check_needs(ctx, BENCH_NEEDS)
    if api not in ("completions", "chat"):
        raise UserError(f"must be completions or chat, got {api!r}", field="--api")
    rate = _check(request_rate, arrival, burstiness, max_concurrency, json_out)
    _check_counts(num_prompts, seed, request_timeout, save_run)
    percentiles = _percentiles(metric_percentiles)
    adapters = _adapters(lora_modules, lora_assignment)
    the_slo = load_slo(slo) if slo is not None else None
    wl = load_workload(workload)
    if not wl.requests:
        raise UserError("the workload has no requests", file=workload, field="--workload")
    # a trace without --request-rate keeps its own pace (rate inf here means "no rescaling")
    reqs, times = bench_schedule(wl, num_prompts, rate, arrival, burstiness, seed)
    reqs = assign_adapters(reqs, adapters, lora_assignment, seed)
    served = _served(url, api_key)
    name = _model_of(served, model)
    _check_served(served, adapters, reqs, workload)
    print(_schedule_line(reqs, url, name, adapters, lora_assignment, rate, arrival, max_concurrency), file=sys.stderr)
    run = run_load_http(url, reqs, times, offered_rate=rate if math.isfinite(rate) else 0.0, model=name,
                        api=api, api_key=api_key, request_timeout_s=request_timeout,
                        stall_timeout_s=request_timeout, metrics=True, sample_interval_s=0,
                        max_concurrency=max_concurrency, max_in_flight=max(2048, len(reqs)))
    # the server's own histograms over the run (two scrapes, none during it): the witness that tells a
    # slow server from a client that waited for a CPU
    check = check_run(run, bound_ms(the_slo.ttft.max_ms if the_slo is not None and the_slo.ttft else None))
    res = bench_result(run, rate=rate, burstiness=burstiness, max_concurrency=max_concurrency, model=name,
                       api=api, percentiles=percentiles, slo=the_slo)
    _print_result(run, res, check, percentiles)
    if json_out is not None:
        json_out.write_text(json.dumps({**res.model_dump(mode="json"), "client_check": check.model_dump(mode="json")},
                                       indent=2) + "\n")
    if save_run is not None:  # an interrupted run too: what was measured is kept
        from tuner.replay.store import save_load_run

        save_load_run(run, save_run)
    if run.interrupted:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    if res.completed == 0:
        print(f"error: all {res.failed} requests failed" + (f": {res.errors[0]}" if res.errors else ""),
              file=sys.stderr)
        sys.exit(1)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
