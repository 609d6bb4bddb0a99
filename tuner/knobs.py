"""The `vllm serve` knobs the tuner turns, as one validated record.

One `Knobs` value is one server launch. `None` means "leave vLLM's default": the launcher then omits the
flag entirely, so the baseline trial is exactly what a user gets from a bare `vllm serve`.
"""

from __future__ import annotations

from dataclasses import dataclass, field as dataclass_field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, create_model, field_validator

from tuner.errors import UserError
from tuner.speculative import canonical

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


@dataclass(frozen=True)
class KnobSpec:
    """Everything the tool knows about one `vllm serve` knob, written once.

    Adding a knob is one entry in `KNOB_SPECS` (plus the simulator's support for it and tests): the
    `Knobs` record, its validation, its `vllm serve` spelling, the diagnoses it answers, the simulator's
    flag parser and the report's quality caveat all read this table."""

    name: str                      # vLLM's EngineArgs name; the flag is --name-with-dashes
    kind: str                      # int | tokens (vLLM's human-readable int: 8k) | fraction | choice | switch
    #                                | json (one JSON object; kept in one canonical spelling)
    help: str
    choices: tuple[str, ...] | None = None   # every value vLLM accepts (a `choice` knob)
    changes_outputs: bool = False  # quantisation: the report says quality is not measured
    neutral: Any = None            # a value that is the same as leaving it unset (kv_cache_dtype auto)
    #: The diagnoses this knob answers: kind -> (rank in that diagnosis's list, direction to turn it)
    answers: dict[str, tuple[int, str]] = dataclass_field(default_factory=dict)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def render(self, value: Any) -> list[str]:
        """`vllm serve` arguments for `value` (a switch set off is --no-<flag>)."""
        if isinstance(value, bool):
            return [self.flag if value else "--no-" + self.flag[2:]]
        return [self.flag, str(value)]

    def annotation(self) -> tuple[Any, Any]:
        """The `Knobs` field: strict (a number is a number: `true` is not 1, "64" is not 64)."""
        if self.kind in ("int", "tokens"):  # vLLM keeps counts and positions in int32 tensors
            return int | None, Field(default=None, ge=1, le=2 ** 31 - 1, strict=True, description=self.help)
        if self.kind == "fraction":
            return float | None, Field(default=None, gt=0.0, le=1.0, strict=True, description=self.help)
        if self.kind == "switch":
            return bool | None, Field(default=None, strict=True, description=self.help)
        return str | None, Field(default=None, strict=True, description=self.help)


KNOB_SPECS: dict[str, KnobSpec] = {s.name: s for s in (
    KnobSpec("max_num_seqs", "int", "sequences in one batch at most",
             answers={"batch_cap": (0, "up"), "decode": (1, "down")}),
    KnobSpec("max_num_batched_tokens", "tokens", "tokens one engine step schedules at most (chunked prefill)",
             answers={"decode": (2, "down"), "prefill": (0, "up")}),
    KnobSpec("gpu_memory_utilization", "fraction", "share of GPU memory vLLM may take (weights + KV cache)",
             answers={"kv_capacity": (0, "up")}),
    KnobSpec("quantization", "choice", "weight quantisation method", choices=VLLM_QUANTIZATIONS,
             changes_outputs=True,
             answers={"kv_capacity": (2, "any"), "decode": (3, "any"), "prefill": (3, "any"), "queue": (0, "any")}),
    KnobSpec("kv_cache_dtype", "choice", "KV cache element type", choices=VLLM_KV_CACHE_DTYPES,
             changes_outputs=True, neutral="auto",
             answers={"kv_capacity": (1, "any"), "decode": (0, "any"), "prefill": (2, "any"), "queue": (1, "any")}),
    KnobSpec("enable_prefix_caching", "switch", "reuse the KV of shared prompt prefixes",
             answers={"prefill": (1, "on")}),
    KnobSpec("max_model_len", "tokens", "longest prompt + output a request may have",
             answers={"kv_capacity": (3, "down")}),
    # The parallel layout. One server uses tensor_parallel_size x data_parallel_size GPUs; a search space
    # with `host_gpus` fills the host with replicas (`SearchSpace.layout`), so layouts compare on one
    # scale: the capacity of the host.
    # More TP: each GPU holds less of the weights, so more KV fits per engine (vLLM's tuning guide: "each
    # GPU has more memory available for KV cache"), and each step reads fewer weight bytes per GPU.
    KnobSpec("tensor_parallel_size", "int", "GPUs one engine splits the model across (tensor parallelism)",
             answers={"kv_capacity": (4, "up"), "decode": (4, "up")}),
    KnobSpec("data_parallel_size", "int", "engine replicas behind the one API server (data parallelism)"),
    # Speculative decoding (tuner.speculative): fewer, cheaper-per-token decode steps while the batch is
    # small; the diagnosis proposes it only for decode-bound knees at low concurrency, first there.
    KnobSpec("speculative_config", "json", "speculative decoding: vLLM's JSON (method, num_speculative_tokens)",
             answers={"decode": (5, "on")}),
)}


def answering(kind: str) -> tuple[list[str], dict[str, str]]:
    """The knobs that answer a diagnosis, in the order to try them, and the direction of each."""
    specs = sorted((s for s in KNOB_SPECS.values() if kind in s.answers), key=lambda s: s.answers[kind][0])
    return [s.name for s in specs], {s.name: s.answers[kind][1] for s in specs}


class _KnobsBase(BaseModel):
    """Serve-time knobs. Field names are vLLM's EngineArgs names; `flags()` gives the CLI spelling."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator(*[n for n, s in KNOB_SPECS.items() if s.kind == "json"], mode="before", check_fields=False)
    @classmethod
    def _json_object(cls, v: Any) -> str | None:
        return None if v is None else canonical(v)

    @field_validator(*[n for n, s in KNOB_SPECS.items() if s.choices], check_fields=False)
    @classmethod
    def _vllm_choice(cls, v: str | None, info: ValidationInfo) -> str | None:
        choices = KNOB_SPECS[info.field_name].choices or ()  # type: ignore[index]
        if v is not None and v not in choices:
            raise ValueError(f"not a vLLM {VLLM_VERSION} choice (choose from {', '.join(choices)})")
        return v

    def flags(self) -> list[str]:
        """`vllm serve` arguments for the knobs that are set (unset ones keep vLLM's default)."""
        return [a for name, value in self.set_only().items() for a in KNOB_SPECS[name].render(value)]

    def set_only(self) -> dict:
        """The knobs that differ from vLLM's defaults, for labels and reports."""
        return {k: v for k, v in self.model_dump().items() if v is not None}

    def with_(self, **changes) -> "Knobs":
        return self.model_copy(update=changes)


#: One `vllm serve` launch's knobs, a field per `KNOB_SPECS` entry.
Knobs = create_model("Knobs", __base__=_KnobsBase, __module__=__name__,
                     **{name: spec.annotation() for name, spec in KNOB_SPECS.items()})
Knobs.__doc__ = _KnobsBase.__doc__


#: Server flags the tool sets itself, or that must not be on a command line any user can read.
TOOL_SET_FLAGS = ("--port", "--host")
SECRET_FLAGS = ("--api-key",)


def check_server_args(extra_args) -> None:
    """Extra `vllm serve` arguments (`--vllm-arg`) that would fight the tool or leak a secret."""
    for a in extra_args:
        flag = a.split("=", 1)[0]
        if flag in SECRET_FLAGS:
            raise UserError("pass the API key with api_key= (it is sent as VLLM_API_KEY), not as --api-key "
                            "on the command line, where any user can read it", field="extra_args")
        if flag in TOOL_SET_FLAGS:
            raise UserError(f"{flag} is set by the tuner; use the engine's host/port options",
                            field="extra_args")
