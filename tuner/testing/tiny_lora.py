"""Make tiny random LoRA adapters for the tiny model (`tiny_model.py`), so real `vllm serve --enable-lora` runs in CI.

Why this exists: the real-vLLM LoRA tests need adapters, and CI can reach no model hub. An adapter folder is
what PEFT saves and vLLM's loader reads (`vllm/lora/lora_model.py`, `from_local_checkpoint`): an
`adapter_config.json` (r, lora_alpha, target_modules, base_model_name_or_path, ...) and an
`adapter_model.safetensors` whose tensors are named as PEFT names them,
`base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight` (shape rank x in) and `...lora_B.weight`
(shape out x rank); vLLM strips `base_model.model.` and the `lora_A/B.weight` tail
(`vllm/lora/utils.py`, `parse_fine_tuned_lora_name`).

The weights are small random float16 numbers (lora_B is not zero, so an adapter really changes the output;
no test reads the text). The safetensors file is written here by hand (an 8-byte header length, a JSON
header, the raw little-endian bytes), so this module needs only numpy and runs in the tuner's own venv,
which has neither torch nor safetensors. Deterministic: same base config, names, rank and seed, same bytes.

Usage: `python -m tuner.testing.tiny_lora BASE_MODEL_DIR OUT_DIR [--count 16] [--rank 8]` writes
OUT_DIR/lora-00 ... OUT_DIR/lora-15.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

# The Qwen2 linear layers a LoRA usually adapts, with how their (in, out) sizes follow from the config.
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
DEFAULT_TARGETS = ATTENTION_MODULES + MLP_MODULES


def module_shapes(config: dict) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each target module of one Qwen2/Llama decoder layer."""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads", heads))
    head_dim = int(config.get("head_dim") or hidden // heads)
    inter = int(config["intermediate_size"])
    return {
        "q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim), "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden),
    }


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """Write `tensors` (float16 arrays) in the safetensors format, names sorted, no metadata beyond the format."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    blobs = []
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name], dtype="<f2")
        data = arr.tobytes()
        header[name] = {"dtype": "F16", "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the format pads the header to an 8-byte boundary
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for data in blobs:
            f.write(data)


def adapter_config(base_model: str, rank: int, targets: tuple[str, ...], alpha: int | None = None) -> dict:
    """The PEFT `adapter_config.json` vLLM's `PEFTHelper` reads: a plain LoRA, no bias, no DoRA."""
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
        "r": rank, "lora_alpha": alpha if alpha is not None else 2 * rank, "lora_dropout": 0.0,
        "target_modules": list(targets), "bias": "none", "fan_in_fan_out": False,
        "modules_to_save": None, "use_rslora": False, "use_dora": False, "inference_mode": True,
    }


def build_adapter(base_model_dir: str | Path, out_dir: str | Path, *, rank: int = 8, seed: int = 0,
                  targets: tuple[str, ...] = DEFAULT_TARGETS) -> Path:
    """Write one adapter folder for the model in `base_model_dir` (its config.json); return the folder."""
    base = Path(base_model_dir)
    config = json.loads((base / "config.json").read_text())
    shapes = module_shapes(config)
    unknown = [t for t in targets if t not in shapes]
    if unknown:
        raise ValueError(f"unknown target module(s) {unknown}; known: {sorted(shapes)}")
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for layer in range(int(config["num_hidden_layers"])):
        for module in targets:
            fan_in, fan_out = shapes[module]
            block = "self_attn" if module in ATTENTION_MODULES else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = rng.normal(0, 0.02, (rank, fan_in)).astype(np.float16)
            tensors[f"{prefix}.lora_B.weight"] = rng.normal(0, 0.02, (fan_out, rank)).astype(np.float16)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / "adapter_model.safetensors", tensors)
    cfg = adapter_config(str(base.resolve()), rank, targets)
    (out / "adapter_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def build_adapters(base_model_dir: str | Path, out_dir: str | Path, *, count: int, rank: int = 8,
                   prefix: str = "lora-") -> dict[str, Path]:
    """`count` adapters named `{prefix}00`, `{prefix}01`, ... under `out_dir`, each with its own seed."""
    width = max(2, len(str(count - 1)))
    made = {}
    for i in range(count):
        name = f"{prefix}{i:0{width}d}"
        made[name] = build_adapter(base_model_dir, Path(out_dir) / name, rank=rank, seed=i)
    return made


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tuner.testing.tiny_lora", description=__doc__.splitlines()[0])
    ap.add_argument("base_model_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--count", type=int, default=16)
    ap.add_argument("--rank", type=int, default=8)
    args = ap.parse_args(argv)
    if not (Path(args.base_model_dir) / "config.json").is_file():
        print(f"error: {args.base_model_dir}/config.json: no such file (a tiny model folder is needed)",
              file=sys.stderr)
        return 2
    if args.count < 1 or args.rank < 1:
        print("error: --count and --rank must be at least 1", file=sys.stderr)
        return 2
    made = build_adapters(args.base_model_dir, args.out_dir, count=args.count, rank=args.rank)
    print(f"{len(made)} LoRA adapters of rank {args.rank} written to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
