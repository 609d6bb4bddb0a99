"""`docs/adding-an-engine.md`, followed literally: its example engine is run as the page writes it, and
every name the page cites exists. A change to the engine interface that the page does not follow fails
here, so the page cannot drift from the code."""

from __future__ import annotations

import importlib
import re
import sys
import types
from pathlib import Path

import httpx
import pytest

from tuner.engine import procs
from tuner.engine.base import Engine, LaunchFailure, Server
from tuner.engine.registry import BUILTIN, EngineSpec, create, names
from tuner.knobs import Knobs
from tuner.testing.conformance import EngineConformance
from tuner.workload.model import WorkloadRequest

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "adding-an-engine.md").read_text()


def _code_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC, re.S)


@pytest.fixture(scope="module")
def doc_engine_module() -> types.ModuleType:
    """The page's code block, run as a module of its own (as a user's adapter package would be)."""
    (code,) = _code_blocks()
    module = types.ModuleType("my_server_engine")
    sys.modules[module.__name__] = module
    exec(compile(code, "docs/adding-an-engine.md", "exec"), module.__dict__)
    yield module
    sys.modules.pop(module.__name__, None)


def test_the_example_registers_and_serves(doc_engine_module, tmp_path: Path) -> None:
    assert "my-server" in names()
    engine = create(EngineSpec(name="my-server", gpu="rtx4090", model="qwen2.5-7b", run_dir=tmp_path))
    assert isinstance(engine, doc_engine_module.MyServerEngine) and engine.name == "my-server"
    server = engine.launch(Knobs(max_num_seqs=64))
    try:
        assert isinstance(server, Server) and server.info.kv_cache_tokens and server.info.startup_s > 0
        assert httpx.get(server.info.base_url + "/health", headers=server.headers).status_code == 200
        reqs = [WorkloadRequest(prompt_tokens=64, output_tokens=8) for _ in range(4)]
        run = server.run_load(reqs, [0.05 * i for i in range(4)], offered_rate=20.0, request_timeout_s=60)
        assert all(r.ok for r in run.records) and run.metrics is not None
        pgid = server.process.pgid
    finally:
        server.stop()
    assert procs.group_members(pgid) == []


def test_the_examples_refused_launch_is_classified(doc_engine_module, tmp_path: Path) -> None:
    engine = create(EngineSpec(name="my-server", gpu="rtx4090", model="qwen2.5-7b", run_dir=tmp_path))
    with pytest.raises(LaunchFailure) as e:
        engine.launch(Knobs(gpu_memory_utilization=0.99))  # more than an RTX 4090 has free
    assert e.value.kind == "memory_utilization" and e.value.facts.asked_utilization == 0.99


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def test_every_name_the_page_cites_exists() -> None:
    dotted = set(re.findall(r"`(tuner(?:\.\w+)+)", DOC))
    assert dotted and not sorted(d for d in dotted if not _resolves(d))
    paths = set(re.findall(r"`((?:tuner|tests|docs)/[\w/.]+)`", DOC))
    assert paths and not sorted(p for p in paths if not (ROOT / p).exists())
    for hook in ("unsupported_value", "check_extra_args", "from_spec", "launch"):
        assert hasattr(Engine, hook), hook
    for member in ("info", "model", "headers", "run_load", "stop", "stop_interrupted"):
        assert member in Server.__annotations__ or hasattr(Server, member), member
    suite = sys.modules[EngineConformance.__module__].__doc__ or ""
    for fixture in ("engine", "tiny_kv_engine", "impossible_memory", "bad_flag_knobs"):
        assert f"`{fixture}`" in DOC and f"`{fixture}`" in suite, fixture
    assert "BUILTIN" in DOC and BUILTIN
