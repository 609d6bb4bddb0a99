"""Engines by name: the one table the tool, the gate and the workers build an engine from.

Like vLLM's `benchmarks/` backends, adding an engine is one entry: a built-in is a row of `BUILTIN`
("module:Class", imported only when used), and an engine outside the package registers itself::

    from tuner.engine.registry import EngineSpec, register

    @register("sglang")
    class SGLangEngine(Engine):
        @classmethod
        def from_spec(cls, spec: EngineSpec) -> "SGLangEngine": ...

`create(EngineSpec(name="sglang", model=...))` then builds it, `tune --engine sglang` runs a study on it,
and `tuner.testing.conformance.EngineConformance` is the suite it must pass.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Callable, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from tuner.engine.base import Engine
from tuner.errors import UserError

#: Built-in engines, "module:Class": imported on first use (the vLLM engine needs no simulator, and so on).
BUILTIN: dict[str, str] = {
    "sim": "tuner.engine.sim:SimEngine",
    "sim-http": "tuner.engine.sim_http:SimHTTPEngine",
    "vllm": "tuner.engine.vllm:VllmEngine",
}
_registered: dict[str, type[Engine]] = {}

E = TypeVar("E", bound=type[Engine])


class EngineSpec(BaseModel):
    """Everything an engine may be built from; each engine reads the fields it needs (`from_spec`)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    gpu: str | None = None
    model: str | None = None
    run_dir: Path = Path("servers")       # where launched servers keep their logs and pidfiles
    noise: float = Field(0.0, ge=0)       # simulated engines: launch-to-launch noise
    seed: int = 0
    time_scale: float = Field(1.0, gt=0)  # the HTTP simulator: how many times slower than the GPU
    python: str | None = None             # vllm: the interpreter of a venv with vLLM
    command: str | None = None            # vllm: a launch template with {model} {port} {host} {args}
    extra_args: list[str] = Field(default_factory=list)
    api_key: str | None = None
    #: simulated engines: time every token (needed for an ITL threshold; slower)
    token_times: bool = True
    #: simulated engines: the GPUs of the host (a layout asking for more fails as vLLM does); None: as
    #: many as each launch's layout asks for
    host_gpus: int | None = None
    #: simulated engines: speculative decoding's acceptance rate per method on this workload (the search
    #: space's `spec_acceptance`); a real engine measures it
    spec_acceptance: dict[str, float] = Field(default_factory=dict)


def register(name: str) -> Callable[[E], E]:
    """Class decorator: make an `Engine` subclass available as `name` (it must define `from_spec`)."""

    def deco(cls: E) -> E:
        if not (isinstance(cls, type) and issubclass(cls, Engine)):
            raise TypeError(f"{cls!r} is not an Engine")
        cls.name = name
        _registered[name] = cls
        return cls

    return deco


def names() -> tuple[str, ...]:
    """Every engine `create` can build: the built-ins, then the registered ones."""
    return tuple(dict.fromkeys([*BUILTIN, *_registered]))


def engine_class(name: str) -> type[Engine]:
    if name in _registered:
        return _registered[name]
    if name not in BUILTIN:
        raise UserError(f"unknown engine {name!r} (known: {', '.join(names())})", field="--engine")
    module, _, cls = BUILTIN[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def create(spec: EngineSpec) -> Engine:
    """The engine `spec` names, built by its own `from_spec` (which checks what it needs)."""
    return engine_class(spec.name).from_spec(spec)
