"""The conformance suite against the in-process simulator (`--engine sim`, virtual time).

It has no HTTP server and no process, so those tests skip (`http = False`, `subprocess = False`); the load,
metrics, token-count and launch-failure tests run in milliseconds of real time. The simulator has no
`--kv-cache-memory-bytes`, so the tiny KV pool the preemption test needs is made the way a user would get
one on a real GPU: a `gpu_memory_utilization` just above the weights, found by inverting vLLM's memory
arithmetic (`tuner.sim.config.resolve`).
"""

from __future__ import annotations

import math

import pytest

from tuner.testing.conformance import EngineConformance
from tuner.engine.sim import SimEngine
from tuner.failures import LaunchFailure
from tuner.knobs import Knobs
from tuner.profiles.gpus import get_gpu
from tuner.profiles.models import get_model
from tuner.sim.config import resolve

GPU, MODEL = "rtx4090", "Qwen/Qwen2.5-7B-Instruct"
#: About 2.5 sequences of the base suite's 800-token preemption requests: three prompts are admitted,
#: then their decodes outgrow the pool (the same 2,048 tokens the real-vLLM suite gives its tiny model).
TINY_KV_TOKENS = 2048


def utilization_for_kv_tokens(gpu: str, model: str, knobs: Knobs, tokens: int) -> float:
    """The `gpu_memory_utilization` whose KV pool holds about `tokens` tokens with these knobs (bisection
    over `resolve`: a launch too small to start counts as too small, one that cannot start as too big)."""
    g, m = get_gpu(gpu), get_model(model)
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        try:
            kv = resolve(g, m, knobs.with_(gpu_memory_utilization=mid)).kv_cache_tokens
        except LaunchFailure as e:
            kv = 0 if e.kind in ("no_cache_blocks", "max_model_len", "oom") else tokens + 1
        lo, hi = (mid, hi) if kv < tokens else (lo, mid)
    return math.ceil(hi * 1e6) / 1e6  # a short flag value, still on the big-enough side


def make_tiny_kv_knobs(gpu: str, model: str) -> Knobs:
    """The base suite's tiny-KV knobs plus the utilization that leaves `TINY_KV_TOKENS` of KV."""
    knobs = EngineConformance.tiny_kv_knobs
    util = utilization_for_kv_tokens(gpu, model, knobs, TINY_KV_TOKENS)
    knobs = knobs.with_(gpu_memory_utilization=util)
    kv = resolve(get_gpu(gpu), get_model(model), knobs).kv_cache_tokens
    assert TINY_KV_TOKENS <= kv < TINY_KV_TOKENS + 64, kv  # within a few blocks of the target
    return knobs


def impossible_memory_launches(engine) -> list:
    """Launches of Qwen2.5-7B on an RTX 4090 that vLLM refuses, each for its own reason."""
    return [
        (engine, Knobs(gpu_memory_utilization=0.05), "no_cache_blocks"),  # less than the weights
        (engine, Knobs(gpu_memory_utilization=0.7), "max_model_len"),  # 32k context > ~0.9 GiB of KV
        (engine, Knobs(gpu_memory_utilization=0.99), "memory_utilization"),  # more than is free
    ]


class TestSimConformance(EngineConformance):
    http = False
    subprocess = False
    bad_flag_knobs = Knobs.model_construct(kv_cache_dtype="fp9")  # past the tool's own check: what the server says
    tiny_kv_knobs = make_tiny_kv_knobs(GPU, MODEL)

    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls):
        return SimEngine(GPU, MODEL)

    @pytest.fixture(scope="class")
    @classmethod
    def tiny_kv_engine(cls):
        return SimEngine(GPU, MODEL)

    @pytest.fixture
    def impossible_memory(self, engine):
        return impossible_memory_launches(engine)

    @pytest.fixture(scope="class")
    @classmethod
    def client(cls):
        # The base class skips HTTP tests in a function-scoped autouse fixture, but pytest sets up this
        # class-scoped fixture first and it needs a base_url the simulator does not have: skip here too.
        pytest.skip(f"{cls.__name__} has no HTTP server (http = False)")
