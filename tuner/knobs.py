"""The `vllm serve` knobs the tuner turns, as one validated record.

One `Knobs` value is one server launch. `None` means "leave vLLM's default": the launcher then omits the
flag entirely, so the baseline trial is exactly what a user gets from a bare `vllm serve`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16")
QUANTIZATIONS = ("fp8", "awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors")


class Knobs(BaseModel):
    """Serve-time knobs. Field names are vLLM's EngineArgs names; `flags()` gives the CLI spelling."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    gpu_memory_utilization: float | None = Field(default=None, gt=0.0, le=1.0)
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    enable_prefix_caching: bool | None = None
    max_model_len: int | None = Field(default=None, ge=1)

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
