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
from tuner.knobs import VLLM_MAX_LORA_RANKS
from tuner.lora.catalog import Adapter, AdapterCatalog, check_workload_adapters, read_lora_dir, write_catalog
from tuner.lora.popularity import adapter_summary
from tuner.slo import load_slo
from tuner.workload.loader import format_names, load_workload, save_workload
from tuner.workload.stats import WorkloadStats, describe
from tuner.workload.synth import KINDS, LORA_ADAPTERS, LORA_ALPHA, SYNTH_BLOCK, lora_name, synthesize

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Synthesize, inspect and check workloads and SLO files.")

_MAX_SKIPPED_SHOWN = 10
_SYNTH_OPTIONS = {"kind": "--kind", "requests": "--requests", "seed": "--seed", "hash_block_size": "--block-size",
                  "adapters": "--adapters", "alpha": "--alpha"}


@app.command()
def synth(
    kind: str = typer.Option(..., "--kind", help=f"One of: {', '.join(KINDS)}."),
    requests: int = typer.Option(1000, "--requests", "-n", help="Number of requests."),
    seed: int = typer.Option(0, "--seed", help="RNG seed: same seed, same file."),
    out: Path = typer.Option(..., "--out", "-o", help="Output JSONL (the project's workload format)."),
    block_size: int = typer.Option(SYNTH_BLOCK, "--block-size",
                                   help="Tokens per prefix hash id (multiple of 16 dividing 256)."),
    adapters: int = typer.Option(LORA_ADAPTERS, "--adapters", help="multitenant-lora: LoRA adapters (tenants)."),
    alpha: float = typer.Option(LORA_ALPHA, "--alpha", help="multitenant-lora: Zipf exponent of the adapters' "
                                "popularity (0: uniform; 1: the skewed Punica/SGLang workloads)."),
    rank: int = typer.Option(16, "--rank", help="multitenant-lora: the adapters' LoRA rank (in the catalog)."),
) -> None:
    """Write a seeded synthetic workload (token counts and prefix hash ids, no text). multitenant-lora also
    writes OUT's adapter catalog (`NAME.adapters.yaml`: names and ranks), to pass as --lora-dir."""
    check_out_file(out, "--out")
    catalog_path = out.with_name(out.name.split(".")[0] + ".adapters.yaml") if kind == "multitenant-lora" else None
    if catalog_path is not None:
        check_out_file(catalog_path, "--out")
        if rank not in VLLM_MAX_LORA_RANKS:
            raise UserError(f"must be one of vLLM's max_lora_rank values ({', '.join(map(str, VLLM_MAX_LORA_RANKS))})",
                            field="--rank")
    from tuner.limits import MAX_SEED, MAX_SYNTH_REQUESTS

    if requests > MAX_SYNTH_REQUESTS:  # the generator holds every request in memory at once
        raise UserError(f"must be <= {MAX_SYNTH_REQUESTS}", field="--requests")
    if seed > MAX_SEED:
        raise UserError(f"must be <= {MAX_SEED}", field="--seed")
    try:
        w = synthesize(kind, requests, seed, hash_block_size=block_size, adapters=adapters, alpha=alpha)
    except UserError as e:  # the library names its parameters; the user typed the options
        raise UserError(e.message, field=_SYNTH_OPTIONS.get(e.field or "", e.field)) from None
    save_workload(w, out)
    s = describe(w)
    Console().print(f"wrote {s.requests} {kind} requests to {out} (mean prompt {s.prompt_tokens.mean:.0f}, "
                    f"mean output {s.output_tokens.mean:.0f} tokens, block reuse {_pct(s.block_reuse)})")
    if catalog_path is not None:
        cat = AdapterCatalog(tuple(Adapter(lora_name(k), rank) for k in range(adapters)))
        write_catalog(cat, catalog_path, f"{adapters} LoRA adapters of rank {rank} for {out.name} (names only: "
                      "for the simulated engines)")
        Console().print(f"wrote {adapters} adapters (rank {rank}, Zipf alpha {alpha:g}) to {catalog_path}: "
                        f"pass --lora-dir {catalog_path}", highlight=False)


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


def _render_lora(lora: dict, console: Console) -> None:
    ranks = f"rank {', '.join(map(str, lora['ranks']))}" if lora["ranks"] else "ranks unknown (no --lora-dir)"
    console.print(f"LoRA adapters: {lora['adapters']} named ({ranks}); {lora['base_model_requests']} requests "
                  f"for the base model", highlight=False)
    console.print(f"popularity: hot decile {_pct(lora['hot_decile_share'])} of requests, cold decile "
                  f"{_pct(lora['cold_decile_share'])}; most requested: "
                  + ", ".join(f"{a['adapter']} {_pct(a['share'])}" for a in lora["most_requested"][:5]),
                  highlight=False)
    console.print("working set (distinct adapters among requests in flight): "
                  + ", ".join(f"{k} in flight: {v:g}" if k.isdigit() else f"{k}: {v:g}"
                              for k, v in lora["working_set"].items()), highlight=False)


def _counter_for(model: str | None):
    """The token counter `--model` names: a local folder (or its config.json) with tokenizer.json. A path
    that is not there, or a folder without a tokenizer, is a mistake (exit 2); a name that is not a local
    path (a hub id) counts with the estimate, and says so."""
    from tuner.tokens import token_counter_for, tokenizer_file

    if model is not None:
        p = Path(model).expanduser()
        if p.exists() and tokenizer_file(model) is None:
            raise UserError(f"{model[:200]}: no tokenizer.json there to count prompt tokens with", field="--model")
        if not p.exists() and model.startswith(("/", ".", "~")):
            raise UserError(f"{model[:200]}: no such file or folder", field="--model")
        if not p.exists():
            print(f"note: --model {model[:200]} is not a local folder; prompt tokens are estimated (about 4 "
                  "characters a token), not counted with its tokenizer", file=sys.stderr)
    return token_counter_for(model)


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
    lora_dir: Optional[Path] = typer.Option(None, "--lora-dir", help="The adapters the requests name: a "
                                            "folder of adapter folders, or a YAML catalog of names and ranks."),
    rate: Optional[float] = typer.Option(None, "--rate", min=0.001, max=1e6,
                                         help="Also show the adapters' working set at this rate (req/s)..."),
    latency_s: float = typer.Option(1.0, "--latency-s", min=0.001, max=3600,
                                    help="...with requests in flight this long each (rate x latency)."),
) -> None:
    """Counts, length percentiles, prefix sharing and arrival rate of a workload file; with LoRA adapters,
    their ranks, popularity and working set."""
    counter = _counter_for(model)
    w = load_workload(file, format=format, skip_invalid=skip_invalid)
    catalog = read_lora_dir(lora_dir) if lora_dir is not None else None
    if catalog is not None:
        check_workload_adapters(w.requests, catalog, file, lora_dir)
    checked = load_slo(slo) if slo is not None else None
    s = describe(w, counter)
    lora = adapter_summary(w.requests, catalog, rate, latency_s)
    for line in w.skipped[:_MAX_SKIPPED_SHOWN]:
        print(f"skipped: {line}", file=sys.stderr)
    if len(w.skipped) > _MAX_SKIPPED_SHOWN:
        print(f"skipped: ... and {len(w.skipped) - _MAX_SKIPPED_SHOWN} more", file=sys.stderr)
    if as_json:
        print(json.dumps({**s.model_dump(), **({"lora": lora} if lora else {})}, indent=2))
        return
    console = Console()
    _render(s, console)
    if lora:
        _render_lora(lora, console)
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
