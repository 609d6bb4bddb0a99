"""`tune sim serve` / `python -m tuner.sim`: start the HTTP simulator with `vllm serve`'s flags.

The flags are parsed with argparse, not typer, because the point is to fail like vLLM: an invalid choice
prints argparse's `error: argument --kv-cache-dtype: invalid choice: ...` and exits 2, which the
launch-log classifier (`tuner.engine.classify`) files as a bad flag exactly as it would for vLLM. Typer
only passes the arguments through.

Start-up order follows vLLM: resolve the configuration (defaults, memory profiling), and on a launch
vLLM would refuse, print its error and exit 1 *before* binding the port; otherwise print the KV-cache log
lines the launchers parse, then serve.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Sequence

import typer

from tuner.knobs import KNOB_SPECS

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="The simulated vLLM engine (no GPU needed).")

_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")


def human_readable_int(value: str) -> int:
    """vLLM's parser for token counts: `8k` = 8000, `8K` = 8192, `25.6k` = 25600, or a plain int."""
    value = value.strip()
    m = _HUMAN_INT.fullmatch(value)
    if m:
        number, suffix = m.groups()
        if suffix in "kmgt":
            return int(float(number) * 10 ** (3 * "kmgt".index(suffix) + 3))
        if "." in number:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}. Did you mean to use "
                f"{number}{suffix.lower()} instead?")
        return int(number) * 2 ** (10 * ("KMGT".index(suffix) + 1))
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: '{value}'") from None


UNMODELLED_SWITCHES = ("--enforce-eager", "--disable-log-requests", "--disable-log-stats",
                       "--trust-remote-code", "--disable-frontend-multiprocessing", "--enable-log-requests",
                       "--disable-uvicorn-access-log")
UNMODELLED_VALUES = ("--dtype", "--uvicorn-log-level", "--generation-config", "--tokenizer-mode", "--tokenizer",
                     "--revision", "--tokenizer-revision", "--download-dir", "--load-format", "--chat-template",
                     "--max-logprobs", "--response-role")


def unmodelled(args: argparse.Namespace) -> list[str]:
    """The accepted-but-not-modelled flags given, as written on the command line."""
    out = [f for f in UNMODELLED_SWITCHES if getattr(args, f[2:].replace("-", "_"))]
    out += [f"{f}={getattr(args, f[2:].replace('-', '_'))}" for f in UNMODELLED_VALUES
            if getattr(args, f[2:].replace("-", "_")) is not None]
    return out


def _acceptance(text: str) -> tuple[str, float]:
    method, _, rate = text.partition("=")
    try:
        value = float(rate)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not METHOD=RATE") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: the rate is a fraction 0..1")
    return method, value


def build_parser(prog: str = "tune sim serve") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description="Serve a simulated vLLM (OpenAI API, /metrics) for a GPU and model profile. "
        "Knob flags are vLLM's.")
    sim = p.add_argument_group("simulation")
    sim.add_argument("--gpu", required=True, help="GPU profile: a built-in name or a profile .yaml")
    sim.add_argument("--model", required=True, help="a built-in model id/alias, or a config.json / model folder")
    sim.add_argument("--time-scale", type=float, default=1.0, metavar="K",
                     help="run the simulated GPU K times slower than real (clients divide timings by K)")
    sim.add_argument("--noise", type=float, default=0.0, help="log-normal sigma of step-time noise")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--spec-acceptance", action="append", default=[], metavar="METHOD=RATE",
                     type=_acceptance, help="speculative decoding: a method's per-position acceptance rate "
                     "on this workload (repeatable; default: tuner.speculative.PRIOR_ACCEPTANCE)")
    v = p.add_argument_group("vllm serve flags")
    v.add_argument("--host", default="127.0.0.1",
                   help="address to bind (vLLM binds all interfaces by default; the simulator stays local)")
    v.add_argument("--port", type=int, default=8000)
    v.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1 (or VLLM_API_KEY)")
    v.add_argument("--served-model-name", nargs="+", default=None)
    for spec in KNOB_SPECS.values():  # every knob, spelled and parsed as vLLM does (choices: the simulated ones)
        kw: dict = {"int": {"type": int}, "tokens": {"type": human_readable_int}, "fraction": {"type": float},
                    "switch": {"action": argparse.BooleanOptionalAction},
                    "choice": {"choices": spec.simulated or spec.choices},
                    "json": {"type": str}}[spec.kind]
        v.add_argument(spec.flag, *([spec.short] if spec.short else []), default=None, help=spec.help, **kw)
    # vLLM flags a study may pass with --vllm-arg that change nothing the simulator models: accepted (a
    # study and its gate run the same command line on every engine), named in the launch log as such;
    # any other flag is refused, as vLLM refuses an unknown one
    u = p.add_argument_group("vllm serve flags accepted and not modelled")
    for flag in UNMODELLED_SWITCHES:
        u.add_argument(flag, action="store_true", default=False)
    for flag in UNMODELLED_VALUES:
        u.add_argument(flag, default=None)
    return p


def check_extra_args(extra: Sequence[str], engine: str = "sim") -> list[str]:
    """The flags among `extra` (a study's `--vllm-arg`s) that the simulator accepts without modelling
    them; a `UserError` naming `--vllm-arg` for any it would refuse, before a study starts (on sim-http
    every launch would fail with it; the in-process simulator would silently ignore it). A knob's flag is
    refused on both: the search sets the knobs, and the in-process simulator takes no server arguments."""
    from tuner.knobs import check_server_args
    from tuner.errors import UserError
    from tuner.knobs import Knobs

    def refuse(message: str) -> None:
        raise UserError(f"{message.replace('unrecognized arguments', 'not accepted')} by --engine {engine} "
                        "(it accepts a few vLLM flags it does not model, e.g. --dtype, --enforce-eager, "
                        "--trust-remote-code: see tune sim serve --help)", field="--vllm-arg")

    try:
        check_server_args(extra)
    except UserError as e:
        raise UserError(e.message, field="--vllm-arg") from None
    for a in extra:
        name = a.split("=", 1)[0].removeprefix("--").removeprefix("no-").replace("-", "_")
        if name in Knobs.model_fields:
            raise UserError(f"{a.split('=', 1)[0]} is a knob the search sets: put it in the search space "
                            "(a knob with one value is fixed)", field="--vllm-arg")
    parser = build_parser()
    parser.error = refuse  # type: ignore[method-assign,assignment]  # argparse's own exit, as a UserError
    return unmodelled(parser.parse_args(["--gpu", "-", "--model", "-", *extra]))


def _knobs(args: argparse.Namespace):
    """`Knobs` from the flags, or (out of range) the error vLLM's pydantic config validation prints."""
    from pydantic import ValidationError

    from tuner.knobs import Knobs

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
        cfg = resolve(gpu, model, knobs)
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
                      tokens=tokens, cost_params=CostParams(spec_acceptance=tuple(args.spec_acceptance)))


@app.command("serve", add_help_option=False,
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def serve(ctx: typer.Context) -> None:
    """Serve the simulated vLLM over HTTP: --gpu, --model, vLLM's knob flags, --time-scale (see --help)."""
    raise SystemExit(main(ctx.args))
