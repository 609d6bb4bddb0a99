"""`vllm serve`'s flags as the HTTP simulator takes them (its command line is `tuner.cli.sim`).

The flags are parsed with argparse, not typer, because the point is to fail like vLLM: an invalid choice
prints argparse's `error: argument --kv-cache-dtype: invalid choice: ...` and exits 2, which the
launch-log classifier (`tuner.engine.classify`) files as a bad flag exactly as it would for vLLM. Typer
only passes the arguments through. The engines check a study's `--vllm-arg`s against the same parser
(`check_extra_args`) before a study starts.
"""

from __future__ import annotations

import argparse
import re
from typing import Sequence

from tuner.errors import UserError
from tuner.knobs import KNOB_SPECS, Knobs, check_server_args

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
                     "--response-role")


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
    sim.add_argument("--lora-dir", default=None, metavar="DIR_OR_YAML",
                     help="with --enable-lora: serve the adapters of a folder of adapter folders, or of a "
                     "names-only YAML catalog (tuner.lora.catalog; not a vLLM flag)")
    sim.add_argument("--spec-acceptance", action="append", default=[], metavar="METHOD=RATE",
                     type=_acceptance, help="speculative decoding: a method's per-position acceptance rate "
                     "on this workload (repeatable; default: tuner.speculative.PRIOR_ACCEPTANCE)")
    v = p.add_argument_group("vllm serve flags")
    v.add_argument("--host", default="127.0.0.1",
                   help="address to bind (vLLM binds all interfaces by default; the simulator stays local)")
    v.add_argument("--port", type=int, default=8000)
    v.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1 (or VLLM_API_KEY)")
    v.add_argument("--served-model-name", nargs="+", default=None)
    v.add_argument("--enable-lora", action="store_true", default=False, help="serve LoRA adapters")
    v.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
                   help="LoRA adapters as vLLM takes them: name=path (a folder with adapter_config.json)")
    v.add_argument("--max-logprobs", type=int, default=20, help="most (prompt) logprobs a request may ask for "
                   "(the quality check asks for 20: tuner.sim.quality)")
    v.add_argument("--enable-scale-out", action="store_true", default=False,
                   help="serve the render endpoints (/v1/completions/render, /v1/chat/completions/render: a "
                   "prompt's token ids), which answer 403 without it (a router's cache-aware routing reads them)")
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
