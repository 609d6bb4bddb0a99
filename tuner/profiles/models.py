"""Model profiles: parameter and KV-cache arithmetic from a Hugging Face `config.json`.

Everything the cost model needs (weight bytes, FLOPs per token, KV bytes per token) is derived here from
the architecture, never typed in, so the capacity arithmetic in REFERENCE.md can be checked against code.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from tuner.errors import UserError

# Bytes per weight of a quantized linear layer, and the extra GEMM work the dequantisation adds once the
# batch is large enough to be compute-bound (Marlin-style W4A16 kernels lose their edge past ~32 tokens).
QUANT_BYTES = {None: 2.0, "awq": 0.5 + 2.5 / 128, "gptq": 0.5 + 2.5 / 128, "fp8": 1.0}
QUANT_DEQUANT_FACTOR = {None: 1.0, "awq": 1.35, "gptq": 1.35, "fp8": 1.0}
KV_DTYPE_BYTES = {"auto": 2.0, "bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0,
                  "fp8_e5m2": 1.0}


class ModelProfile(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = ""
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    quantization: str | None = None  # of the checkpoint itself (AWQ/GPTQ); fp8 is an online choice
    source: str = ""

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.hd

    def kv_bytes_per_token(self, kv_dtype: str = "auto") -> int:
        """2 (K and V) x layers x KV heads x head dim x bytes per element."""
        return int(2 * self.num_hidden_layers * self.kv_heads * self.hd * KV_DTYPE_BYTES[kv_dtype])

    @property
    def linear_params(self) -> int:
        """Parameters of the decoder layers' linear projections (what quantization shrinks)."""
        h, kv = self.hidden_size, self.kv_heads * self.hd
        attn = h * self.q_dim + 2 * h * kv + self.q_dim * h
        mlp = 3 * h * self.intermediate_size
        return self.num_hidden_layers * (attn + mlp)

    @property
    def embedding_params(self) -> int:
        emb = self.vocab_size * self.hidden_size
        return emb if self.tie_word_embeddings else 2 * emb

    @property
    def other_params(self) -> int:
        bias = (self.q_dim + 2 * self.kv_heads * self.hd) if self.attention_bias else 0
        return self.num_hidden_layers * (2 * self.hidden_size + bias) + self.hidden_size

    @property
    def total_params(self) -> int:
        return self.linear_params + self.embedding_params + self.other_params

    def weight_bytes(self, quantization: str | None = None) -> float:
        """Bytes of weights in GPU memory; embeddings and lm_head stay 16-bit under every method here."""
        q = quantization or self.quantization
        return (self.linear_params * QUANT_BYTES[_family(q)]
                + 2.0 * (self.embedding_params + self.other_params))

    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size


def _family(q: str | None) -> str | None:
    if q is None:
        return None
    q = q.lower()
    for fam in ("awq", "gptq", "fp8"):
        if q.startswith(fam) or (fam == "fp8" and q == "compressed-tensors"):
            return fam
    raise UserError(f"unsupported quantization {q!r} (awq, gptq, fp8)", field="--quantization")


def quant_family(q: str | None) -> str | None:
    return _family(q)


@lru_cache(maxsize=1)
def builtin_models() -> dict[str, ModelProfile]:
    data = yaml.safe_load(resources.files("tuner.profiles").joinpath("data/models.yaml").read_text())
    out: dict[str, ModelProfile] = {}
    for key, body in data.items():  # bases come before their quantized variants in the file
        body = dict(body)
        body.pop("aliases", None)
        base = body.pop("base", None)
        merged = {**out[base].model_dump(), **body} if base else body
        out[key] = ModelProfile(**{**merged, "name": key})
    return out


def _aliases() -> dict[str, str]:
    data = yaml.safe_load(resources.files("tuner.profiles").joinpath("data/models.yaml").read_text())
    out = {}
    for key, body in data.items():
        out[key.lower()] = key
        out[key.split("/")[-1].lower()] = key
        for a in body.get("aliases", []):
            out[str(a).lower()] = key
    return out


def load_hf_config(path: str | Path) -> ModelProfile:
    """A user's model: a local `config.json` or a model folder containing one."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        raise UserError("no such file", file=str(p))
    try:
        cfg = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"not valid JSON: {e.msg}", file=str(p), line=e.lineno) from None
    cfg = cfg.get("text_config", cfg)  # multimodal wrappers keep the LM config inside
    qc = cfg.get("quantization_config") or {}
    method = qc.get("quant_method")
    try:
        return ModelProfile(**cfg, name=str(path), quantization=method if method in QUANT_BYTES else None,
                            source=str(p))
    except ValidationError as e:
        err = e.errors()[0]
        raise UserError(err["msg"], file=str(p), field=".".join(map(str, err["loc"]))) from None


def get_model(name: str) -> ModelProfile:
    """A built-in model by HF id or alias, or a local config.json / model folder."""
    key = _aliases().get(name.lower())
    if key:
        return builtin_models()[key]
    if Path(name).exists():
        return load_hf_config(name)
    known = ", ".join(builtin_models())
    raise UserError(f"unknown model {name!r} (built-in: {known}; or a path to config.json)",
                    field="--model")
