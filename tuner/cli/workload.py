"""`tune workload ...`: make, look at and check the inputs of a tuning run before spending GPU time on them.

Only option parsing and printing live here; the work is in `synth`, `loader`, `stats` and `tuner.slo`, so
the same functions serve the search and the reports. Errors are `UserError`s, which `tuner.cli.main` turns
into one line and exit code 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from tuner.errors import UserError
from tuner.inputs import check_out_file
from tuner.slo import load_slo
from tuner.workload.loader import format_names, load_workload, save_workload
from tuner.workload.stats import WorkloadStats, describe
from tuner.workload.synth import KINDS, SYNTH_BLOCK, synthesize

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Synthesize, inspect and check workloads and SLO files.")

_MAX_SKIPPED_SHOWN = 10
_SYNTH_OPTIONS = {"kind": "--kind", "requests": "--requests", "seed": "--seed", "hash_block_size": "--block-size"}


@app.command()
def synth(
    kind: str = typer.Option(..., "--kind", help=f"One of: {', '.join(KINDS)}."),
    requests: int = typer.Option(1000, "--requests", "-n", help="Number of requests."),
    seed: int = typer.Option(0, "--seed", help="RNG seed: same seed, same file."),
    out: Path = typer.Option(..., "--out", "-o", help="Output JSONL (the project's workload format)."),
    block_size: int = typer.Option(SYNTH_BLOCK, "--block-size",
                                   help="Tokens per prefix hash id (multiple of 16 dividing 256)."),
) -> None:
    """Write a seeded synthetic workload (token counts and prefix hash ids, no text)."""
    check_out_file(out, "--out")
    from tuner.limits import MAX_SEED, MAX_SYNTH_REQUESTS

    if requests > MAX_SYNTH_REQUESTS:  # the generator holds every request in memory at once
        raise UserError(f"must be <= {MAX_SYNTH_REQUESTS}", field="--requests")
    if seed > MAX_SEED:
        raise UserError(f"must be <= {MAX_SEED}", field="--seed")
    try:
        w = synthesize(kind, requests, seed, hash_block_size=block_size)
    except UserError as e:  # the library names its parameters; the user typed the options
        raise UserError(e.message, field=_SYNTH_OPTIONS.get(e.field or "", e.field)) from None
    save_workload(w, out)
    s = describe(w)
    Console().print(f"wrote {s.requests} {kind} requests to {out} (mean prompt {s.prompt_tokens.mean:.0f}, "
                    f"mean output {s.output_tokens.mean:.0f} tokens, block reuse {_pct(s.block_reuse)})")


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _render(s: WorkloadStats, console: Console) -> None:
    console.print(f"[bold]{s.name}[/bold] ({s.source_format}): {s.requests} requests"
                  + (f", {s.skipped} invalid lines skipped" if s.skipped else "")
                  + (f", {s.tenants} tenants" if s.tenants else ""))
    t = Table("tokens", "mean", "p50", "p90", "p99", "min", "max", "total")
    for label, d, total in (("prompt", s.prompt_tokens, s.total_prompt_tokens),
                            ("output", s.output_tokens, s.total_output_tokens)):
        t.add_row(label, *(f"{v:.0f}" for v in (d.mean, d.p50, d.p90, d.p99, d.min, d.max)), str(total))
    console.print(t)
    console.print(f"token counts: {s.token_count}", highlight=False)
    if s.block_reuse is None:
        console.print("shared prefix: unknown (no prompt text or prefix hash ids)")
    else:
        console.print(f"shared prefix: {_pct(s.block_reuse)} of prompt blocks repeat an earlier prefix; "
                      f"{_pct(s.requests_sharing_prefix)} of requests share their first block")
    if s.arrival_rate is not None:
        console.print(f"arrivals: {s.arrival_rate:.2f} req/s over {s.duration_s:.1f} s, "
                      f"inter-arrival CV {s.interarrival_cv:.2f} (1 = Poisson)")
    else:
        console.print("arrivals: none in the file (pick a rate and a poisson or gamma process)")
    peak = max((b.count for b in s.prompt_histogram), default=0) or 1
    console.print("prompt tokens:")
    for b in s.prompt_histogram:
        bar = "█" * round(40 * b.count / peak)
        console.print(f"  {b.lo:>7}-{b.hi:<7} {bar} {b.count}", highlight=False)


@app.command()
def inspect(
    file: Path = typer.Argument(..., help="Workload file (any supported format)."),
    format: Optional[str] = typer.Option(None, "--format", "-f",
                                         help=f"Override detection: {', '.join(format_names())}."),
    skip_invalid: bool = typer.Option(False, "--skip-invalid", help="Skip bad lines (they are counted)."),
    as_json: bool = typer.Option(False, "--json", help="Print the statistics as JSON."),
    slo: Optional[Path] = typer.Option(None, "--slo", help="Also check this SLO file."),
    model: Optional[str] = typer.Option(None, "--model", help="A local model folder (or its config.json) "
                                        "with tokenizer.json: count prompt text with its tokenizer."),
) -> None:
    """Counts, length percentiles, prefix sharing and arrival rate of a workload file."""
    from tuner.tokens import token_counter_for

    w = load_workload(file, format=format, skip_invalid=skip_invalid)
    checked = load_slo(slo) if slo is not None else None
    s = describe(w, token_counter_for(model))
    for line in w.skipped[:_MAX_SKIPPED_SHOWN]:
        print(f"skipped: {line}", file=sys.stderr)
    if len(w.skipped) > _MAX_SKIPPED_SHOWN:
        print(f"skipped: ... and {len(w.skipped) - _MAX_SKIPPED_SHOWN} more", file=sys.stderr)
    if as_json:
        print(json.dumps(s.model_dump(), indent=2))
        return
    console = Console()
    _render(s, console)
    if checked is not None:
        console.print(f"SLO {slo}: {checked.describe()}")


@app.command("check-slo")
def check_slo(file: Path = typer.Argument(..., help="SLO YAML file.")) -> None:
    """Validate an SLO file and print what it promises."""
    s = load_slo(file)
    extra = []
    if s.peak_rate is not None:
        extra.append(f"peak {s.peak_rate:g} req/s")
    extra.append(f"headroom {s.headroom:g}")
    if s.price_per_gpu_hour is not None:
        extra.append(f"${s.price_per_gpu_hour:g}/GPU-hour")
    Console().print(f"{file}: {s.describe()}; {', '.join(extra)}", highlight=False)
