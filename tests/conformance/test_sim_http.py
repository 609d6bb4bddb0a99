"""The conformance suite against the HTTP simulator (`--engine sim-http`): real subprocesses, real HTTP.

Every test runs, including the HTTP and process ones the in-process simulator skips. Sizes are chosen so
the suite takes seconds on a 2-core machine: the servers model an H100 (about 6 ms decode steps for
Qwen2.5-7B, so the preemption burst is about 6 s of simulated time) at time scale 0.5 (the simulated GPU
runs twice as fast as real time, which the host still serves on time at these batch sizes of at most
16). Launch failures are checked on an RTX 4090, where Qwen2.5-7B's weights leave little room.
"""

from __future__ import annotations

import pytest

from tuner.testing.conformance import EngineConformance
from tests.conformance.test_sim import impossible_memory_launches, make_tiny_kv_knobs
from tuner.engine.sim_http import SimHTTPEngine
from tuner.knobs import Knobs

GPU, MODEL = "h100-sxm", "Qwen/Qwen2.5-7B-Instruct"
TIME_SCALE = 0.5


class TestSimHTTPConformance(EngineConformance):
    bad_flag_knobs = Knobs.model_construct(kv_cache_dtype="fp9")  # past the tool's own check: what the server says
    tiny_kv_knobs = make_tiny_kv_knobs(GPU, MODEL)

    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls, tmp_path_factory):
        return SimHTTPEngine(GPU, MODEL, time_scale=TIME_SCALE, run_dir=tmp_path_factory.mktemp("sim-http"))

    @pytest.fixture(scope="class")
    @classmethod
    def tiny_kv_engine(cls, engine):
        return engine

    @pytest.fixture
    def impossible_memory(self, tmp_path):
        return impossible_memory_launches(SimHTTPEngine("rtx4090", MODEL, run_dir=tmp_path))
