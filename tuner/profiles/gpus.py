"""GPU profiles: the few numbers of a GPU that decide how fast a model serves on it.

Built-ins come from `data/gpus.yaml` with the datasheet source beside each figure; users add their own by
passing a YAML file of the same shape.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner.errors import UserError

GIB = 1024 ** 3


class GPUProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = ""
    name: str
    aliases: list[str] = Field(default_factory=list)
    memory_gib: float = Field(gt=0)
    bandwidth_gbs: float = Field(gt=0)
    bf16_tflops: float = Field(gt=0)
    fp8_tflops: float = Field(gt=0)
    fp8_native: bool
    compute_capability: float = 8.0
    source: str = ""

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB

    @property
    def bandwidth(self) -> float:
        """Bytes per second."""
        return self.bandwidth_gbs * 1e9

    @property
    def is_a100(self) -> bool:
        return "A100" in self.name


def _parse(data: dict, where: str) -> dict[str, GPUProfile]:
    out = {}
    if not isinstance(data, dict):
        raise UserError("expected a mapping of GPU key -> profile", file=where)
    for key, body in data.items():
        try:
            out[key] = GPUProfile(key=key, **(body or {}))
        except (ValidationError, TypeError) as e:
            err = e.errors()[0] if isinstance(e, ValidationError) else {"loc": (), "msg": str(e)}
            field = ".".join(str(x) for x in (key, *err["loc"]))
            raise UserError(err["msg"], file=where, field=field) from None
    return out


@lru_cache(maxsize=1)
def builtin_gpus() -> dict[str, GPUProfile]:
    text = resources.files("tuner.profiles").joinpath("data/gpus.yaml").read_text()
    return _parse(yaml.safe_load(text), "gpus.yaml")


def get_gpu(name: str) -> GPUProfile:
    """A built-in GPU by key or alias (case-insensitive), or a user's YAML file with one profile."""
    path = Path(name)
    if name.endswith((".yaml", ".yml")):
        if not path.exists():
            raise UserError("no such file", file=name)
        profiles = _parse(yaml.safe_load(path.read_text()), name)
        return next(iter(profiles.values()))
    want = name.lower()
    for key, gpu in builtin_gpus().items():
        if want == key.lower() or want in (a.lower() for a in gpu.aliases) or want == gpu.name.lower():
            return gpu
    known = ", ".join(builtin_gpus())
    raise UserError(f"unknown GPU {name!r} (built-in: {known}; or pass a profile .yaml)", field="--gpu")
