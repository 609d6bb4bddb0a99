"""`tune sim serve` / `python -m tuner.cli.serve_sim`: start the HTTP simulator with `vllm serve`'s flags.

The flags and their parser are the simulator's (`tuner.sim.flags`); this module only runs it. Start-up
order follows vLLM: resolve the configuration (defaults, memory profiling), and on a launch vLLM would
refuse, print its error and exit 1 *before* binding the port; otherwise print the KV-cache log lines the
launchers parse, then serve. The server's modules are imported when it starts, not when `tune` registers
this sub-command (a CLI module may import lazily: it is the top layer).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

import typer

from tuner.sim.flags import build_parser, unmodelled

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="The simulated vLLM engine (no GPU needed).")

def _knobs(args: argparse.Namespace):
    """`Knobs` from the flags, or (out of range) the error vLLM's pydantic config validation prints."""
    from pydantic import ValidationError

    from tuner.knobs import KNOB_SPECS, Knobs

    values = {name: getattr(args, name) for name in Knobs.model_fields}
    try:
        return Knobs(**values)
    except ValidationError as e:
        err = e.errors()[0]
        field = str(err["loc"][0])
        config = KNOB_SPECS[field].config if field in KNOB_SPECS else "EngineArgs"
        return (f"pydantic_core._pydantic_core.ValidationError: 1 validation error for "
                f"{config}\n{field}\n  {err['msg']} [type={err['type']}, "
                f"input_value={err['input']!r}, input_type={type(err['input']).__name__}]")


def _out_of_range(args: argparse.Namespace) -> str | None:
    """The first number outside its range (`tuner.limits`), as argparse words it; None if all are in."""
    import math

    from tuner.limits import MAX_SEED, MAX_TIME_SCALE

    if not (math.isfinite(args.time_scale) and 0 < args.time_scale <= MAX_TIME_SCALE):
        return f"--time-scale: must be > 0 and <= {MAX_TIME_SCALE:g}, got {args.time_scale}"
    if not (math.isfinite(args.noise) and 0 <= args.noise <= 1):
        return f"--noise: must be 0..1, got {args.noise}"
    if not 0 <= args.seed <= MAX_SEED:
        return f"--seed: must be 0..{MAX_SEED}, got {args.seed}"
    if not 0 <= args.port <= 65535:
        return f"--port: must be 0..65535, got {args.port}"
    return None


def _adapters(args: argparse.Namespace, model):
    """The LoRA adapters to serve (`--enable-lora` with `--lora-modules name=path` and/or `--lora-dir`),
    or None with LoRA off; a `UserError` for a bad adapter folder or catalog."""
    from dataclasses import replace
    from pathlib import Path

    from tuner.errors import UserError
    from tuner.lora.catalog import read_adapter_folder, read_lora_dir
    from tuner.sim.lora import LoraSetup

    if not args.enable_lora:
        if args.lora_modules or args.lora_dir:
            raise UserError("needs --enable-lora", field="--lora-modules" if args.lora_modules else "--lora-dir")
        return None
    adapters = list(read_lora_dir(args.lora_dir).adapters) if args.lora_dir else []
    for entry in args.lora_modules or ():
        name, eq, path = entry.partition("=")
        if not eq or not name or not path:
            raise UserError(f"{entry!r} is not name=path", field="--lora-modules")
        adapters.append(replace(read_adapter_folder(Path(path)), name=name))
    names = [a.name for a in adapters]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"two adapters named {twice[0]!r}", field="--lora-modules")
    return LoraSetup.of(adapters, model)


def _fail(message: str, code: int = 1) -> int:
    print(message, file=sys.stderr, flush=True)
    return code


def main(argv: Sequence[str] | None = None, prog: str = "tune sim serve") -> int:
    """Parse, resolve, serve. Returns the exit code (argparse exits 2 by itself on a bad flag)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    args = build_parser(prog).parse_args(argv)
    bad = _out_of_range(args)
    if bad:
        return _fail(f"{prog}: error: argument {bad}", 2)

    from tuner.errors import UserError
    from tuner.failures import LaunchFailure
    from tuner.profiles.gpus import get_gpu
    from tuner.profiles.models import get_model
    from tuner.sim.config import resolve

    knobs = _knobs(args)
    if isinstance(knobs, str):
        return _fail(knobs)
    try:
        gpu, model = get_gpu(args.gpu), get_model(args.model)
        cfg = resolve(gpu, model, knobs, lora=_adapters(args, model))
    except UserError as e:
        return _fail(f"error: {e.format()}", 2)
    except LaunchFailure as e:
        return _fail(e.message)  # vLLM logs the exception line and exits before binding
    if cfg.data_parallel_size > 1:
        return _fail("NotImplementedError: the HTTP simulator runs one engine core; data_parallel_size > 1 "
                     "is simulated in-process only (--engine sim)")
    print(cfg.launch_log(), flush=True)
    ignored = unmodelled(args)
    if ignored:
        print(f"INFO simulator: accepted, not modelled: {' '.join(ignored)}", flush=True)
    from tuner.tokens import token_counter_for

    tokens = token_counter_for(args.model)
    print(f"INFO simulator: token counts: {tokens.source}", flush=True)

    api_key = args.api_key or os.environ.get("VLLM_API_KEY") or None
    names = args.served_model_name or [args.model]
    from tuner.sim.costs import CostParams
    from tuner.sim.server import run_server

    return run_server(cfg, host=args.host, port=args.port, served_names=names, api_key=api_key,
                      time_scale=args.time_scale, noise=args.noise, seed=args.seed, root=args.model,
                      tokens=tokens, cost_params=CostParams(spec_acceptance=tuple(args.spec_acceptance)),
                      max_logprobs=args.max_logprobs, scale_out=args.enable_scale_out)


@app.command("serve", add_help_option=False,
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def serve(ctx: typer.Context) -> None:
    """Serve the simulated vLLM over HTTP: --gpu, --model, vLLM's knob flags, --time-scale (see --help)."""
    raise SystemExit(main(ctx.args))

