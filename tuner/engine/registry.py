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
from typing import Any, Callable, TypeVar

from pydantic import Field

from tuner.engine.base import Engine
from tuner.errors import UserError
from tuner.limits import SEED
from tuner.settings import EngineSettings

#: Built-in engines, "module:Class": imported on first use (the vLLM engine needs no simulator, and so on).
BUILTIN: dict[str, str] = {
    "sim": "tuner.engine.sim:SimEngine",
    "sim-http": "tuner.engine.sim_http:SimHTTPEngine",
    "vllm": "tuner.engine.vllm:VllmEngine",
}
_registered: dict[str, type[Engine]] = {}

E = TypeVar("E", bound=type[Engine])


class EngineSpec(EngineSettings):
    """Everything an engine may be built from: the run's engine settings (`tuner.settings`, declared
    there once) and what the study derives for it; each engine reads the fields it needs (`from_spec`)."""

    run_dir: Path = Path("servers")       # where launched servers keep their logs and pidfiles
    seed: int = SEED                      # simulated engines: the noise's seed (the run's `--seed`)
    #: simulated engines: time every token (needed for an ITL threshold; slower)
    token_times: bool = True
    #: simulated engines: the GPUs of the host (a layout asking for more fails as vLLM does); None: as
    #: many as each launch's layout asks for
    host_gpus: int | None = None
    #: simulated engines: speculative decoding's acceptance rate per method on this workload (the search
    #: space's `spec_acceptance`); a real engine measures it
    spec_acceptance: dict[str, float] = Field(default_factory=dict)


def spec_of(settings: EngineSettings, **derived: Any) -> EngineSpec:
    """The spec an engine is built from: every one of the run's engine settings, and what the study
    derives for it (`run_dir`, `seed`, `token_times`, `host_gpus`, `spec_acceptance`)."""
    return EngineSpec(**dict(settings), **derived)


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
