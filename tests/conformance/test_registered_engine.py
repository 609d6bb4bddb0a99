"""An engine from outside the package: registered through the public registry, it runs the shipped
conformance suite and a whole study, exactly as the built-in engines do.

The stand-in is what a third-party adapter looks like (an SGLang or TGI engine would be the same shape):
a class in its own module that subclasses `Engine`, says how it is built from an `EngineSpec`, and is
registered with `@register(name)`. To keep the suite fast it serves through the in-process simulator;
nothing in the tool knows that.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.test_sim import GPU, MODEL, impossible_memory_launches, make_tiny_kv_knobs
from tuner.engine.base import Engine, Server
from tuner.engine.registry import EngineSpec, create, names, register
from tuner.engine.sim import SimEngine
from tuner.knobs import Knobs
from tuner.testing.conformance import EngineConformance

NAME = "outside-standin"


@register(NAME)
class StandInEngine(Engine):
    """A third-party engine: the tool reaches it only through the registry."""

    virtual_time = True
    simulated = True

    def __init__(self, gpu: str, model: str):
        self._inner = SimEngine(gpu, model)

    @classmethod
    def from_spec(cls, spec: EngineSpec) -> "StandInEngine":
        return cls(spec.gpu or GPU, spec.model or MODEL)

    def launch(self, knobs: Knobs) -> Server:
        return self._inner.launch(knobs)


def test_the_registry_builds_the_outside_engine() -> None:
    assert NAME in names()
    engine = create(EngineSpec(name=NAME, gpu=GPU, model=MODEL))
    assert isinstance(engine, StandInEngine) and engine.name == NAME


def test_a_study_runs_on_the_outside_engine(tmp_path: Path) -> None:
    """`tune --engine outside-standin` in-process: the study, its report and its gate."""
    from tuner.study import run_tune, settings_from_options

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "run"
    opts = settings_from_options(dict(workload=root / "workloads" / "chat.jsonl",
                                      slo=root / "workloads" / "chat.slo.yaml", out=out, engine=NAME, gpu=GPU,
                                      model=MODEL, max_trials=1, confirm=False, requests_per_run=200))
    outcome, _ = run_tune(opts)
    assert outcome.baseline is not None and outcome.baseline.capacity_rps
    assert (out / "report.md").exists() and (out / "gate.yaml").exists()
    assert "SIMULATED" in (out / "report.md").read_text()  # the engine said it is simulated


class TestOutsideEngineConformance(EngineConformance):
    http = False
    subprocess = False
    bad_flag_knobs = Knobs.model_construct(kv_cache_dtype="fp9")  # past the tool's own check
    tiny_kv_knobs = make_tiny_kv_knobs(GPU, MODEL)

    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls):
        return create(EngineSpec(name=NAME, gpu=GPU, model=MODEL))

    @pytest.fixture(scope="class")
    @classmethod
    def tiny_kv_engine(cls):
        return create(EngineSpec(name=NAME, gpu=GPU, model=MODEL))

    @pytest.fixture
    def impossible_memory(self, engine):
        return impossible_memory_launches(engine)

    @pytest.fixture(scope="class")
    @classmethod
    def client(cls):
        pytest.skip(f"{cls.__name__} has no HTTP server (http = False)")
