"""The LoRA adapters a workload's requests name: their names, ranks, target modules, bytes and folders.

One catalog, read once, serves every part that needs adapters: the study checks the workload and the
search space against it, the simulator charges each adapter's slot, load and compute costs, and a real
`vllm serve` is launched with `--enable-lora --lora-modules name=path` from it.

`--lora-dir` is either a folder holding one folder per adapter (PEFT's layout: `adapter_config.json` with
`r` and `target_modules`, and `adapter_model.safetensors` or `.bin`), as vLLM loads them, or a YAML file
that lists adapters by name and rank only (what the simulator needs; `tune workload synth --kind
multitenant-lora` writes one). Each mistake is one line naming the folder or the file's line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from tuner.errors import UserError
from tuner.inputs import DuplicateKey, JSONLimit, loads_json, parse_yaml, read_text, safetensors_header, yaml_line
from tuner.knobs import KNOB_SPECS, VLLM_MAX_LORA_RANKS

#: A names-only catalog's rank when it states none: vLLM's default `--max-lora-rank`.
VLLM_DEFAULT_MAX_LORA_RANK: int = KNOB_SPECS["max_lora_rank"].default
#: The modules a synthetic or names-only adapter targets when the catalog does not say (attention and
#: MLP projections, PEFT's names for Llama/Qwen-style models).
DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
CONFIG_FILE = "adapter_config.json"
MAX_ADAPTERS = 100_000


@dataclass(frozen=True)
class Adapter:
    """One LoRA adapter. `bytes` is its weights' size on disk (None for a names-only catalog: the
    simulator then sizes it from the model's shapes); `path` its folder (None: names only)."""

    name: str
    rank: int
    target_modules: tuple[str, ...] = DEFAULT_TARGET_MODULES
    bytes: int | None = None
    path: str | None = None


@dataclass(frozen=True)
class AdapterCatalog:
    """The adapters a run may name, by name, and where they were read from."""

    adapters: tuple[Adapter, ...]
    source: str = ""
    by_name: dict[str, Adapter] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {a.name: a for a in self.adapters})

    def __len__(self) -> int:
        return len(self.adapters)

    def __contains__(self, name: object) -> bool:
        return name in self.by_name

    @property
    def max_rank(self) -> int:
        return max((a.rank for a in self.adapters), default=0)

    @property
    def has_paths(self) -> bool:
        """Every adapter has a folder: a real `vllm serve` can load them (`--lora-modules`)."""
        return bool(self.adapters) and all(a.path for a in self.adapters)

    def lora_modules(self) -> list[str]:
        """vLLM's `--lora-modules` arguments, `name=path` each."""
        return [f"{a.name}={a.path}" for a in self.adapters if a.path]


def _check_name(name: Any, where: str | Path, line: int | None = None) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > 256 or any(c.isspace() or c in "=,"
                                                                                for c in name):
        shown = repr(name[:40]) + (f" ... ({len(name):,} characters)" if len(name) > 40 else "") \
            if isinstance(name, str) else repr(name)[:60]
        raise UserError(f"adapter name {shown} must be 1-256 characters without spaces, '=' or ','",
                        file=where, line=line, field="name")
    return name


def _check_rank(rank: Any, where: str | Path, line: int | None = None, field_name: str = "rank") -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= max(VLLM_MAX_LORA_RANKS):
        raise UserError(f"must be an integer 1..{max(VLLM_MAX_LORA_RANKS)}, got {rank!r}", file=where,
                        line=line, field=field_name)
    return rank


def _modules(value: Any, where: str | Path, line: int | None = None, field_name: str = "target_modules"
             ) -> tuple[str, ...]:
    if isinstance(value, str):  # PEFT allows one regex string; count it as the default set
        return DEFAULT_TARGET_MODULES if value in ("all-linear", "") or not value.isidentifier() else (value,)
    if not isinstance(value, list) or not value or not all(isinstance(m, str) and m for m in value):
        raise UserError("must be a non-empty list of module names", file=where, line=line, field=field_name)
    return tuple(value)


def safetensors_ranks(path: Path) -> set[int]:
    """The ranks of an adapter's weights: the first dimension of each `lora_A` tensor in the file's header."""
    ranks = set()
    for name, info in safetensors_header(path).items():
        shape = info.get("shape") if isinstance(info, dict) else None
        if "lora_A" in name and isinstance(shape, list) and shape and isinstance(shape[0], int):
            ranks.add(shape[0])
    return ranks


def read_adapter_folder(folder: Path) -> Adapter:
    """One PEFT adapter folder as vLLM loads it: its config's rank and target modules, its weights' size."""
    cfg_path = folder / CONFIG_FILE
    if cfg_path.exists() and not cfg_path.is_file():
        raise UserError("is a directory, not the adapter's config file", file=cfg_path, field="--lora-dir")
    if not cfg_path.is_file():
        raise UserError(f"adapter folder without {CONFIG_FILE} (every folder in --lora-dir is one adapter: "
                        f"{CONFIG_FILE} + {WEIGHT_FILES[0]})", file=folder, field="--lora-dir")
    text = read_text(cfg_path, "adapter config")
    try:
        cfg = loads_json(text)
    except JSONLimit as e:
        raise UserError(str(e), file=cfg_path) from None
    except json.JSONDecodeError as e:
        raise UserError(f"invalid JSON: {e.msg}", file=cfg_path, line=e.lineno) from None
    except DuplicateKey as e:
        raise UserError("given twice", file=cfg_path, field=e.key) from None
    if not isinstance(cfg, dict):
        raise UserError("expected a JSON object", file=cfg_path)
    if "r" not in cfg:
        raise UserError("missing (the adapter's rank)", file=cfg_path, field="r")
    rank = _check_rank(cfg["r"], cfg_path, field_name="r")
    modules = _modules(cfg.get("target_modules", list(DEFAULT_TARGET_MODULES)), cfg_path)
    weights = [folder / w for w in WEIGHT_FILES if (folder / w).is_file()]
    if not weights:
        raise UserError(f"no adapter weights ({' or '.join(WEIGHT_FILES)})", file=folder, field="--lora-dir")
    if weights[0].name.endswith(".safetensors"):
        found = safetensors_ranks(weights[0])
        if found and found != {rank}:
            raise UserError(f"is {rank} but the weights in {weights[0].name} are rank "
                            f"{', '.join(map(str, sorted(found)))} (the first dimension of each lora_A): a folder "
                            f"whose config and weights disagree fails inside vLLM's worker", file=cfg_path, field="r")
    return Adapter(name=_check_name(folder.name, folder), rank=rank, target_modules=modules,
                   bytes=weights[0].stat().st_size, path=str(folder.resolve()))


def _unique(adapters: Iterable[tuple[Adapter, str | Path, int | None]]) -> tuple[Adapter, ...]:
    seen: dict[str, str] = {}
    out = []
    for a, where, line in adapters:
        if a.name in seen:
            raise UserError(f"two adapters named {a.name!r} (also {seen[a.name]}): a request names its "
                            "adapter by name, so names must be unique", file=where, line=line, field="name")
        seen[a.name] = f"{where}:{line}" if line else str(where)
        out.append(a)
    if len(out) > MAX_ADAPTERS:
        raise UserError(f"{len(out)} adapters: at most {MAX_ADAPTERS}", field="--lora-dir")
    return tuple(out)


def _read_yaml_catalog(path: Path) -> AdapterCatalog:
    """A names-only catalog: `rank` and `target_modules` defaults, then `adapters:` entries (a name, or a
    mapping with `name` and optionally `rank`, `target_modules`)."""
    data, root = parse_yaml(read_text(path, "adapter catalog", field="--lora-dir"), path)
    if not isinstance(data, dict) or not isinstance(data.get("adapters"), list) or not data["adapters"]:
        raise UserError("expected a mapping with a non-empty 'adapters' list", file=path, line=1,
                        field="adapters")
    unknown = sorted(set(data) - {"adapters", "rank", "target_modules", "description"})
    if unknown:
        raise UserError("unknown key (known: adapters, rank, target_modules, description)", file=path,
                        line=yaml_line(root, [unknown[0]]), field=unknown[0])
    rank0 = _check_rank(data.get("rank", VLLM_DEFAULT_MAX_LORA_RANK), path, yaml_line(root, ["rank"]))
    mods0 = _modules(data.get("target_modules", list(DEFAULT_TARGET_MODULES)), path,
                     yaml_line(root, ["target_modules"]))
    entries = []
    for i, e in enumerate(data["adapters"]):
        line = yaml_line(root, ["adapters", i])
        e = {"name": e} if isinstance(e, str) else e
        if not isinstance(e, dict) or set(e) - {"name", "rank", "target_modules"}:
            raise UserError("an adapter is a name or a mapping of name, rank, target_modules", file=path,
                            line=line, field=f"adapters.{i}")
        a = Adapter(name=_check_name(e.get("name"), path, line), rank=_check_rank(e.get("rank", rank0), path, line),
                    target_modules=_modules(e["target_modules"], path, line) if "target_modules" in e else mods0)
        entries.append((a, path, line))
    return AdapterCatalog(_unique(entries), source=str(path))


def read_lora_dir(path: str | Path) -> AdapterCatalog:
    """The adapters under `--lora-dir`: a folder of adapter folders, or a YAML catalog of names and ranks."""
    p = Path(path).expanduser()
    if not p.exists():
        raise UserError("no such folder or file", file=path, field="--lora-dir")
    if p.is_file():
        return _read_yaml_catalog(p)
    folders = sorted(c for c in p.iterdir() if c.is_dir() and not c.name.startswith("."))
    if not folders:
        raise UserError("holds no adapter folders (one folder per adapter, each with "
                        f"{CONFIG_FILE})", file=path, field="--lora-dir")
    return AdapterCatalog(_unique((read_adapter_folder(f), f, None) for f in folders), source=str(p))


def write_catalog(catalog: AdapterCatalog, path: Path, description: str = "") -> None:
    """A names-only YAML catalog (`--lora-dir` reads it back)."""
    import yaml

    common = catalog.adapters[0]
    same = all(a.rank == common.rank and a.target_modules == common.target_modules for a in catalog.adapters)
    data: dict[str, Any] = {"description": description} if description else {}
    if same:
        data.update(rank=common.rank, target_modules=list(common.target_modules),
                    adapters=[a.name for a in catalog.adapters])
    else:
        data["adapters"] = [{"name": a.name, "rank": a.rank, "target_modules": list(a.target_modules)}
                            for a in catalog.adapters]
    path.write_text(yaml.safe_dump(data, sort_keys=False, width=100), encoding="utf-8")


def named_adapters(requests: Iterable[Any]) -> list[str]:
    """The adapters a workload's requests name, in first-use order (the base model's requests name none)."""
    return list(dict.fromkeys(r.lora for r in requests if r.lora is not None))


def check_workload_adapters(requests: list[Any], catalog: AdapterCatalog | None, workload: str | Path,
                            lora_dir: str | Path | None = None) -> None:
    """Every adapter a request names must be in the catalog (vLLM answers an unknown `model` with 404)."""
    for i, r in enumerate(requests):
        if r.lora is None:
            continue
        if catalog is None:
            raise UserError(f"names LoRA adapter {r.lora!r}: pass --lora-dir (a folder of adapter folders, "
                            "or a YAML list of adapter names and ranks)", file=workload, field="lora")
        if r.lora not in catalog:
            raise UserError(f"request {i + 1} names adapter {r.lora!r}, which is not in --lora-dir "
                            f"{lora_dir or catalog.source} ({len(catalog)} adapters)", file=workload, field="lora")


def serve_args(lora_dir: str | Path | None) -> list[str]:
    """The `vllm serve` arguments that turn LoRA on and list the adapters (`--enable-lora --lora-modules
    name=path ...`); just `--enable-lora` for a names-only catalog or one no longer readable (a report is
    rebuilt from storage, where the folder may be gone). [] without `--lora-dir`."""
    if not lora_dir:
        return []
    try:
        modules = read_lora_dir(lora_dir).lora_modules()
    except UserError:
        modules = []
    return ["--enable-lora", *(["--lora-modules", *modules] if modules else [])]
