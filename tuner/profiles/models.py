"""Model profiles: parameter and KV-cache arithmetic from a Hugging Face `config.json`.

Everything the cost model needs (weight bytes, FLOPs per token, KV bytes per token) is derived here from
the architecture, never typed in, so the capacity arithmetic in REFERENCE.md can be checked against code.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner.errors import UserError
from tuner.inputs import DuplicateKey, JSONLimit, loads_json, read_text
from tuner.validation import first_error

# Bytes per weight of a quantized linear layer, and the extra GEMM work the dequantisation adds once the
# batch is large enough to be compute-bound (Marlin-style W4A16 kernels lose their edge past ~32 tokens).
# "int4" is any other 4-bit integer weight-only checkpoint (compressed-tensors W4A16, ModelOpt INT4-AWQ):
# vLLM runs it with the same Marlin kernels as GPTQ, so it costs what GPTQ costs.
QUANT_BYTES = {None: 2.0, "awq": 0.5 + 2.5 / 128, "gptq": 0.5 + 2.5 / 128, "int4": 0.5 + 2.5 / 128, "fp8": 1.0}
QUANT_DEQUANT_FACTOR = {None: 1.0, "awq": 1.35, "gptq": 1.35, "int4": 1.35, "fp8": 1.0}
KV_DTYPE_BYTES = {"auto": 2.0, "bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0,
                  "fp8_e5m2": 1.0}


class ModelProfile(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = ""
    # positive and far below anything that breaks the arithmetic (a 0 divides by zero, a 1e30 overflows)
    num_hidden_layers: int = Field(ge=1, le=10_000, strict=True)
    hidden_size: int = Field(ge=1, le=1_000_000, strict=True)
    num_attention_heads: int = Field(ge=1, le=100_000, strict=True)
    num_key_value_heads: int | None = Field(None, ge=1, le=100_000, strict=True)
    head_dim: int | None = Field(None, ge=1, le=100_000, strict=True)
    intermediate_size: int = Field(ge=1, le=100_000_000, strict=True)
    vocab_size: int = Field(ge=1, le=100_000_000, strict=True)
    # the longest context vLLM allows (after RoPE scaling)
    max_position_embeddings: int = Field(4096, ge=1, le=2 ** 31 - 1, strict=True)
    # vLLM's default when shorter (LongRoPE: the original length)
    default_max_model_len: int | None = Field(None, ge=1, le=2 ** 31 - 1, strict=True)
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    quantization: str | None = None  # of the checkpoint itself (AWQ/GPTQ); fp8 is an online choice
    source: str = ""

    @property
    def default_len(self) -> int:
        """`--max-model-len` when unset, as vLLM derives it."""
        return self.default_max_model_len or self.max_position_embeddings

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.hd

    def kv_bytes_per_token(self, kv_dtype: str = "auto", tp: int = 1) -> int:
        """2 (K and V) x layers x KV heads x head dim x bytes per element; with `tp`, one GPU's share: its
        KV heads (vLLM replicates a head on several GPUs when there are fewer heads than GPUs)."""
        heads = self.kv_heads if tp == 1 else max(1, -(-self.kv_heads // tp))
        return int(2 * self.num_hidden_layers * heads * self.hd * KV_DTYPE_BYTES[kv_dtype])

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
    if q == "int4":
        return q
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


#: RoPE types whose config already gives the scaled length in `max_position_embeddings` (vLLM 0.32,
#: `_get_and_verify_max_len` in vllm/config/model.py): for these the factor is not applied again.
ROPE_PRESCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def derived_max_len(cfg: dict) -> tuple[int | None, int | None]:
    """(longest context, default context) of an HF config as vLLM 0.32 derives them: the
    `max_position_embeddings` times the RoPE scaling factor, except for the types in `ROPE_PRESCALED`
    (YaRN, Llama-3, LongRoPE write the scaled length there already) and Gemma 3; LongRoPE defaults to
    `original_max_position_embeddings` (long positions cost quality below it)."""
    mpe = cfg.get("max_position_embeddings")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    if not isinstance(mpe, int) or isinstance(mpe, bool) or not isinstance(rope, dict):
        return mpe, None
    params = [p for p in rope.values() if isinstance(p, dict)] if all(
        isinstance(p, dict) for p in rope.values()) and rope else [rope]
    factor, longrope = 1.0, False
    for rp in params:
        kind = rp.get("rope_type", rp.get("type", "default"))
        longrope |= kind in ("longrope", "su")
        if kind not in ROPE_PRESCALED:
            factor = rp.get("factor", factor) or 1.0
    if "gemma3" in str(cfg.get("model_type", "")):
        factor = 1.0
    longest = int(mpe * factor)
    default = cfg.get("original_max_position_embeddings") if longrope else None
    return longest, default if isinstance(default, int) and default < longest else None


def checkpoint_quantization(qc: Any, where: str) -> str | None:
    """The weight precision the cost model knows (`QUANT_BYTES`) of a pre-quantized checkpoint's
    `quantization_config`, or a `UserError`: a checkpoint simulated as 16-bit when it is not would
    get the memory and the speed of another model."""
    if not qc:
        return None
    if not isinstance(qc, dict):
        raise UserError("must be a mapping", file=where, field="quantization_config")
    method = str(qc.get("quant_method", "")).lower()
    field = "quantization_config.quant_method"
    if method in ("awq", "gptq"):
        bits = qc.get("bits", qc.get("w_bit", 4))
        if bits == 4:
            return method
        field, method = "quantization_config.bits", f"{method} with {bits}-bit weights"
    elif method in ("fp8", "fbgemm_fp8"):
        return "fp8"
    elif method == "compressed-tensors":
        weights = [g.get("weights") or {} for g in (qc.get("config_groups") or {}).values() if isinstance(g, dict)]
        kinds = {(w.get("type"), w.get("num_bits")) for w in weights if isinstance(w, dict)}
        if kinds == {("float", 8)}:
            return "fp8"
        if kinds == {("int", 4)}:
            return "int4"
        field = "quantization_config.config_groups"
        method += " with " + (", ".join(f"{t} {b}-bit" for t, b in sorted(kinds, key=str)) or "no weight groups")
    elif method == "modelopt":
        algo = str(qc.get("quant_algo") or (qc.get("quantization") or {}).get("quant_algo") or "").upper()
        if algo == "FP8":
            return "fp8"
        if algo in ("W4A16_AWQ", "INT4_AWQ"):
            return "int4"
        field, method = "quantization_config.quant_algo", f"modelopt {algo or '(no quant_algo)'}"
    raise UserError(f"{method or 'an unnamed method'} is not supported by the simulator's cost model "
                    "(supported: AWQ/GPTQ 4-bit, FP8, compressed-tensors FP8 or INT4 weights, modelopt FP8 "
                    "or INT4-AWQ)", file=where, field=field)


def load_hf_config(path: str | Path) -> ModelProfile:
    """A user's model: a local `config.json` or a model folder containing one."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    text = read_text(p, "config.json", field="--model")
    try:
        cfg = loads_json(text)
    except JSONLimit as e:
        raise UserError(str(e), file=str(p)) from None
    except json.JSONDecodeError as e:
        raise UserError(f"not valid JSON: {e.msg}", file=str(p), line=e.lineno) from None
    except DuplicateKey as e:
        raise UserError("given twice", file=str(p), line=_json_line(text, e.key), field=e.key) from None
    if not isinstance(cfg, dict):
        raise UserError(f"expected a JSON object (a Hugging Face config.json), got {type(cfg).__name__}",
                        file=str(p), line=1)
    inner = cfg.get("text_config", cfg)  # multimodal wrappers keep the LM config inside
    cfg = inner if isinstance(inner, dict) else cfg
    quant = checkpoint_quantization(cfg.get("quantization_config") or cfg.get("compression_config"), str(p))
    _check_rope(cfg, str(p), text)
    longest, default = derived_max_len(cfg)
    lens = {"max_position_embeddings": longest, "default_max_model_len": default} if longest else {}
    try:
        profile = ModelProfile(**{**cfg, **lens, "name": str(path), "quantization": quant, "source": str(p)})
    except ValidationError as e:
        field, msg = first_error(e)
        raise UserError(msg, file=str(p), line=_json_line(text, field), field=field) from None
    bad = shape_error(profile)
    if bad:
        raise UserError(bad[1], file=str(p), line=_json_line(text, bad[0]), field=bad[0])
    return profile


def shape_error(m: ModelProfile) -> tuple[str, str] | None:
    """(field, why) where vLLM would refuse the architecture: the hidden state splits evenly into
    attention heads (unless `head_dim` says otherwise), and query heads into groups of KV heads."""
    if m.head_dim is None and m.hidden_size % m.num_attention_heads:
        return "hidden_size", (f"{m.hidden_size} is not divisible by num_attention_heads "
                               f"({m.num_attention_heads}), and no head_dim is given")
    if m.num_key_value_heads is not None and m.num_attention_heads % m.num_key_value_heads:
        return "num_key_value_heads", (f"num_attention_heads ({m.num_attention_heads}) is not divisible by "
                                       f"num_key_value_heads ({m.num_key_value_heads})")
    return None


def _check_rope(cfg: dict, where: str, text: str) -> None:
    """A RoPE scaling factor multiplies the context length: it must be a finite number > 0."""
    import math

    for key in ("rope_scaling", "rope_parameters"):
        rope = cfg.get(key)
        groups = [rope] if isinstance(rope, dict) else []
        groups += [g for g in (rope or {}).values() if isinstance(g, dict)] if isinstance(rope, dict) else []
        for g in groups:
            f = g.get("factor")
            if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f)
                                  or not 0 < f <= 1_000_000):
                raise UserError(f"must be a finite number > 0, got {f!r}", file=where,
                                line=_json_line(text, key), field=f"{key}.factor")


def _json_line(text: str, field: str | None) -> int | None:
    """Line of `"field":` in a JSON file (config.json keeps one key a line), for `file:line` errors."""
    if not field:
        return None
    key = field.split(".")[0]
    for i, line in enumerate(text.splitlines(), 1):
        if f'"{key}"' in line:
            return i
    return None


def hub_id(name: str) -> str:
    """The name `vllm serve` loads for `name`: a built-in profile's alias (`qwen2.5-7b`) is its Hugging
    Face id (`Qwen/Qwen2.5-7B-Instruct`); anything else is returned as given. A command a user copies from
    a simulated study must run on a real one."""
    return _aliases().get(name.lower(), name)


def get_model(name: str) -> ModelProfile:
    """A built-in model by HF id or alias, or a local config.json / model folder."""
    key = _aliases().get(name.lower())
    if key:
        return builtin_models()[key]
    if Path(name).expanduser().exists():
        return load_hf_config(name)
    if name.startswith(("/", ".", "~")) or name.endswith(".json"):  # a path; "org/name" is a hub id
        raise UserError("no such file or folder", file=name, field="--model")
    known = ", ".join(builtin_models())
    raise UserError(f"unknown model {name!r} (built-in: {known}; or a path to config.json)",
                    field="--model")
