"""The benchmark landscapes: scenario = GPU, model, workload, SLO, search space, arrival process."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tuner.search.space import SearchSpace
from tuner.sim.costs import CostParams
from tuner.slo import SLO, load_slo
from tuner.workload.loader import load_workload
from tuner.workload.model import Workload

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Scenario:
    name: str
    gpu: str
    model: str
    workload_path: str
    slo_path: str
    space: SearchSpace
    arrival: str = "poisson"
    #: The engine's true cost parameters (None: the simulator's nominal ones). A hidden truth
    #: (`benchmarks/twin_hidden_truth.py`) sets numbers and terms the twin is not told.
    truth: CostParams | None = None

    def workload(self) -> Workload:
        return load_workload(ROOT / self.workload_path)

    def slo(self) -> SLO:
        return load_slo(ROOT / self.slo_path)


def _space(name: str, **values) -> SearchSpace:
    return SearchSpace(name=name, knobs={k: {"values": v} for k, v in values.items()},
                       constraints=["max_num_batched_tokens >= max_num_seqs"])


# Grids small enough to be measured exhaustively (the ground truth) on a 2-core machine, wide enough that
# the vLLM default is not the optimum.
CHAT_SPACE = _space("bench-chat", max_num_seqs=[32, 64, 128, 256, 512],
                    max_num_batched_tokens=[512, 1024, 2048, 4096, 8192],
                    kv_cache_dtype=["auto", "fp8"], enable_prefix_caching=[True, False])
RAG_SPACE = _space("bench-rag", max_num_seqs=[16, 64, 256, 1024],
                   max_num_batched_tokens=[2048, 8192, 16384],
                   gpu_memory_utilization=[0.92, 0.95], kv_cache_dtype=["auto", "fp8"])

SCENARIOS = [
    Scenario("chat-rtx4090", "rtx4090", "qwen2.5-7b", "workloads/chat.jsonl", "workloads/chat.slo.yaml",
             CHAT_SPACE),
    Scenario("rag32k-h100", "h100", "llama-3.1-8b", "workloads/rag.jsonl", "workloads/rag.slo.yaml",
             RAG_SPACE),
    Scenario("strict-tpot-a100", "a100", "qwen2.5-7b", "workloads/chat.jsonl",
             "workloads/chat-strict.slo.yaml", CHAT_SPACE),
    Scenario("azure-trace-l40s", "l40s", "qwen2.5-7b", "workloads/azure_conv_excerpt.csv",
             "workloads/azure.slo.yaml", CHAT_SPACE, arrival="trace"),
]
