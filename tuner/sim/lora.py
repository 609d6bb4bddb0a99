"""Multi-LoRA serving in the simulator: adapter slots, the CPU cache, load costs and the LoRA compute.

What vLLM does (vllm/lora/, vllm/v1/core/sched/scheduler.py, REFERENCE.md section 7), and how it is priced:

- GPU memory: every LoRA-wrapped linear layer holds stacked A/B buffers for `max_loras` slots of
  `max_lora_rank` (vLLM wraps every supported projection, whatever the adapters target): reserved at
  start-up, so it comes out of the KV pool (`lora_reserved_bytes`). LoRA also grows the CUDA-graph pool
  (vllm PR #25914 measured 1.62 -> 2.38 GiB: `LORA_GRAPH_GIB`).
- Scheduling: a step holds requests of at most `max_loras` distinct adapters; a waiting request whose
  adapter is not among them is skipped, not blocking the queue (`AdapterSlots.may_schedule`).
- Loads: an adapter entering the batch that is not in a GPU slot is copied into the least recently used
  free slot (CPU -> GPU over the host link); if it is not in the CPU cache (`max_cpu_loras`, LRU) it is
  first read from disk. vLLM does this synchronously before the step's forward pass, so the whole step
  waits: that is the thrash cost.
- Compute: Punica's shrink/expand per token and rank, and each active adapter's weights read once a step.

The load and kernel figures marked "estimate" are not fitted to a measurement: they set the scale of the
thrash, not its existence (which comes from the slot arithmetic and the scheduling rule above).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from pydantic import BaseModel

from tuner.lora.catalog import read_lora_dir
from tuner.profiles.models import get_model

GIB = 2 ** 30
#: CUDA-graph memory LoRA adds (vllm PR #25914: 1.62 -> 2.38 GiB with LoRA on).
LORA_GRAPH_GIB = 0.76
LORA_DTYPE_BYTES = 2                 # bf16/fp16 adapters (vLLM's lora_dtype auto: the model's dtype)
DISK_GBS = 1.5                       # estimate: safetensors read + vLLM's per-module processing, GB/s
DISK_FIXED_S = 0.03                  # estimate: opening and parsing an adapter checkpoint
HOST_LINK_GBS = 25.0                 # CPU -> GPU where the profile's GPU link is NVLink (PCIe 4.0 x16)
SLOT_COPY_FIXED_S = 0.004            # estimate: one copy per wrapped module and layer into the slot
STEP_OVERHEAD_S = 0.0004             # estimate: the Punica kernels' launches of a step with LoRA on
SGMV_EFF = 0.15                      # estimate: achieved / peak tensor throughput of shrink/expand


def module_dims(model: Any) -> dict[str, tuple[int, int]]:
    """(in, out) features of each projection a LoRA adapter may target, PEFT's names."""
    h, kv, q, i = model.hidden_size, model.kv_heads * model.hd, model.q_dim, model.intermediate_size
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def params_per_rank(model: Any, modules: tuple[str, ...] | None = None) -> int:
    """LoRA parameters per unit of rank, all layers: sum over modules of (in + out). Unknown module names
    (a model-specific projection) count as a hidden x hidden projection."""
    dims = module_dims(model)
    names = tuple(dims) if modules is None else modules
    per_layer = sum(sum(dims.get(m, (model.hidden_size, model.hidden_size))) for m in names)
    return per_layer * model.num_hidden_layers


class LoraSetup(BaseModel):
    """The adapters a simulated server serves: each one's rank and weight bytes, by name."""

    names: list[str]
    ranks: list[int]
    bytes: list[float]
    paths: list[str | None] = []      # each adapter's folder (None: a names-only catalog)

    @classmethod
    def of(cls, adapters: Any, model: Any) -> "LoraSetup":
        """From `tuner.lora.catalog.Adapter`s: bytes on disk where known, else sized from the model."""
        return cls(names=[a.name for a in adapters], ranks=[a.rank for a in adapters], paths=[a.path for a in adapters],
                   bytes=[float(a.bytes) if a.bytes else float(a.rank * params_per_rank(model, a.target_modules)
                                                                 * LORA_DTYPE_BYTES) for a in adapters])

    @classmethod
    def from_dir(cls, lora_dir: str | None, model: Any) -> "LoraSetup | None":
        """The adapters under `--lora-dir` for a model (a profile or its name); None without one."""
        if not lora_dir:
            return None
        profile = get_model(model) if isinstance(model, str) else model
        return cls.of(read_lora_dir(lora_dir).adapters, profile)

    def index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.names)}


def reserved_bytes(model: Any, max_loras: int, max_lora_rank: int, tp: int) -> float:
    """GPU memory of the slots, per GPU: `max_loras x max_lora_rank` A/B rows in every wrapped module,
    plus LoRA's CUDA-graph pool."""
    return max_loras * max_lora_rank * params_per_rank(model) * LORA_DTYPE_BYTES / tp + LORA_GRAPH_GIB * GIB


class AdapterSlots:
    """One engine's adapters: which requests' adapters run (vLLM's scheduled set), the GPU slots and CPU
    cache (both LRU), the time loads and the LoRA kernels add to a step, and the load counters."""

    def __init__(self, cfg: Any, setup: LoraSetup):
        self.max_loras, self.max_cpu = cfg.max_loras, cfg.max_cpu_loras
        self.setup = setup
        gpu, model, tp = cfg.gpu, cfg.model, cfg.tensor_parallel_size
        host = gpu.link_gbs if gpu.interconnect == "pcie" else HOST_LINK_GBS
        # fully sharded layers split shrink and expand TP ways; vLLM's default shards only the expand
        share = 1.0 / tp if cfg.fully_sharded_loras or tp == 1 else 0.5 * (1.0 + 1.0 / tp)
        self._to_gpu = [SLOT_COPY_FIXED_S + b * share / (host * 1e9) for b in setup.bytes]
        self._from_disk = [DISK_FIXED_S + b / (DISK_GBS * 1e9) for b in setup.bytes]
        self._read = [b * share / (gpu.bandwidth * 0.7) for b in setup.bytes]
        self._flop_per_token = [2.0 * 2 * r * params_per_rank(model) * share / (gpu.bf16_tflops * 1e12 * SGMV_EFF)
                                for r in setup.ranks]
        self.running: dict[int, int] = {}        # adapter -> running requests that name it
        self.gpu: OrderedDict[int, None] = OrderedDict()
        self.cpu: OrderedDict[int, None] = OrderedDict()
        self.gpu_loads = 0
        self.disk_loads = 0

    def may_schedule(self, adapter: int) -> bool:
        """vLLM's rule: a request joins the step if its adapter already runs or a slot is still free."""
        return adapter in self.running or len(self.running) < self.max_loras

    def admitted(self, adapter: int) -> None:
        self.running[adapter] = self.running.get(adapter, 0) + 1

    def released(self, adapter: int) -> None:
        left = self.running[adapter] - 1
        if left:
            self.running[adapter] = left
        else:
            del self.running[adapter]

    def step_time(self, tokens: int) -> float:
        """Seconds LoRA adds to a step of `tokens` tokens: loading the running adapters that are not in a
        GPU slot (from disk first where the CPU cache misses), then the shrink/expand kernels."""
        load = 0.0
        for a in self.running:
            if a in self.gpu:
                self.gpu.move_to_end(a)
                continue
            if a in self.cpu:
                self.cpu.move_to_end(a)
            else:
                load += self._from_disk[a]
                self.disk_loads += 1
                self.cpu[a] = None
                if len(self.cpu) > self.max_cpu:
                    self.cpu.popitem(last=False)
            load += self._to_gpu[a]
            self.gpu_loads += 1
            self.gpu[a] = None
            if len(self.gpu) > self.max_loras:
                self._evict_gpu()
        return load + self.compute_time(tokens)

    def _evict_gpu(self) -> None:
        """The least recently used slot whose adapter is not running gives way."""
        for a in self.gpu:
            if a not in self.running:
                del self.gpu[a]
                return
        self.gpu.popitem(last=False)

    def compute_time(self, tokens: int) -> float:
        """The LoRA kernels of a step: each running adapter's weights read once, its tokens' FLOPs
        (tokens are spread over the adapters in proportion to their running requests)."""
        if not self.running:
            return 0.0
        n = sum(self.running.values())
        read = sum(self._read[a] for a in self.running)
        flops = sum(self._flop_per_token[a] * tokens * c / n for a, c in self.running.items())
        return STEP_OVERHEAD_S + max(read, flops)

    def waiting_adapters(self, waiting: Any) -> int:
        """Distinct adapters of waiting requests that do not run (vLLM's `waiting_lora_adapters` less the
        running ones): the requests that wait for a slot."""
        return len({s.lora for s in waiting if s.lora >= 0 and s.lora not in self.running})
