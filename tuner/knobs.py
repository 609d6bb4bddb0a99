"""The `vllm serve` knobs the tuner turns, as one validated record.

One `Knobs` value is one server launch. `None` means "leave vLLM's default": the launcher then omits the
flag entirely, so the baseline trial is exactly what a user gets from a bare `vllm serve`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

VLLM_VERSION = "0.32"  # the vLLM whose flags and choices the tuner knows

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16")
QUANTIZATIONS = ("fp8", "awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors")
# Every value vLLM 0.32's `vllm serve` accepts (`CacheDType` in vllm/config/cache.py, `QuantizationMethods`
# in vllm/model_executor/layers/quantization/__init__.py). A value outside these fails at launch on every
# engine, so it is refused where the user wrote it; the simulator models the subsets above.
VLLM_KV_CACHE_DTYPES = (
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit",
    "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4", "nvfp4_4over6")
VLLM_QUANTIZATIONS = (
    "awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
    "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin", "humming", "compressed-tensors",
    "experts_int8", "quark", "moe_wna16", "torchao", "inc", "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8",
    "online", "fp8_per_tensor", "fp8_per_block", "fp8_per_channel", "int8_per_channel_weight_only",
    "nvfp4_per_token", "mxfp8")
_CHOICES = {"kv_cache_dtype": VLLM_KV_CACHE_DTYPES, "quantization": VLLM_QUANTIZATIONS}


class Knobs(BaseModel):
    """Serve-time knobs. Field names are vLLM's EngineArgs names; `flags()` gives the CLI spelling."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # strict: a number is a number (`true` is not 1, "64" is not 64), a switch is true or false
    max_num_seqs: int | None = Field(default=None, ge=1, strict=True)
    max_num_batched_tokens: int | None = Field(default=None, ge=1, strict=True)
    gpu_memory_utilization: float | None = Field(default=None, gt=0.0, le=1.0, strict=True)
    quantization: str | None = Field(default=None, strict=True)
    kv_cache_dtype: str | None = Field(default=None, strict=True)
    enable_prefix_caching: bool | None = Field(default=None, strict=True)
    max_model_len: int | None = Field(default=None, ge=1, strict=True)

    @field_validator("quantization", "kv_cache_dtype")
    @classmethod
    def _vllm_choice(cls, v: str | None, info: ValidationInfo) -> str | None:
        choices = _CHOICES[info.field_name]  # type: ignore[index]
        if v is not None and v not in choices:
            raise ValueError(f"not a vLLM {VLLM_VERSION} choice (choose from {', '.join(choices)})")
        return v

    def flags(self) -> list[str]:
        """`vllm serve` arguments for the knobs that are set (unset ones keep vLLM's default)."""
        out: list[str] = []
        for name, value in self.model_dump().items():
            if value is None:
                continue
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                out.append(flag if value else "--no-" + flag[2:])
            else:
                out += [flag, str(value)]
        return out

    def set_only(self) -> dict:
        """The knobs that differ from vLLM's defaults, for labels and reports."""
        return {k: v for k, v in self.model_dump().items() if v is not None}

    def with_(self, **changes) -> "Knobs":
        return self.model_copy(update=changes)


KnobName = Literal[
    "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "quantization",
    "kv_cache_dtype", "enable_prefix_caching", "max_model_len",
]


#: Server flags the tool sets itself, or that must not be on a command line any user can read.
TOOL_SET_FLAGS = ("--port", "--host")
SECRET_FLAGS = ("--api-key",)


def check_server_args(extra_args) -> None:
    """Extra `vllm serve` arguments (`--vllm-arg`) that would fight the tool or leak a secret."""
    from tuner.errors import UserError

    for a in extra_args:
        flag = a.split("=", 1)[0]
        if flag in SECRET_FLAGS:
            raise UserError("pass the API key with api_key= (it is sent as VLLM_API_KEY), not as --api-key "
                            "on the command line, where any user can read it", field="extra_args")
        if flag in TOOL_SET_FLAGS:
            raise UserError(f"{flag} is set by the tuner; use the engine's host/port options",
                            field="extra_args")
