"""The run settings are one model: every option of `tune`, `tune worker` and `tune gate` maps onto it in one
table, the study stores it whole and reads it back, and a study stored before it existed still reads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import typer

from tuner.errors import UserError
from tuner.settings import (OPTIONS, WORKER_OPTIONS, EngineSettings, RunSettings, default, from_options,
                            host_engine)
from tuner.storage.records import StudyInfo

ROOT = Path(__file__).resolve().parents[2]


def _params(name: str | None = None) -> dict:
    """The click parameters of `tune` (or of its sub-command `name`), by Python name."""
    from tuner.cli import app

    cmd = typer.main.get_command(app)
    if name is not None:
        cmd = cmd.commands[name]
    return {p.name: p for p in cmd.params}


def test_every_tune_option_maps_onto_one_field_and_takes_its_default() -> None:
    params = _params()
    assert set(params) <= set(OPTIONS), set(params) - set(OPTIONS)
    # and the reverse: a setting the map names is one a user can give (the docs named `--noise-floor`,
    # which was in the map and not on the command line)
    # (`write_outputs` is the Python entry point's alone: a study run from code may skip writing the report)
    assert set(OPTIONS) - {"write_outputs"} <= set(params), set(OPTIONS) - set(params)
    for name, p in params.items():
        if p.default is not None:  # an option left unset is the field's default, whatever it is
            assert p.default == default(name), name


def test_the_engine_options_of_worker_and_gate_are_the_same_fields() -> None:
    engine = {o for o, path in OPTIONS.items() if path.startswith("engine.")}
    devices = {o for o, path in OPTIONS.items() if path.startswith("devices.")}  # each host its own devices
    for cmd, own in (("worker", {"out", "storage", *WORKER_OPTIONS, *devices}), ("gate", {"workload", "slo"})):
        host = set(_params(cmd)) & set(OPTIONS) - own
        assert host and host <= engine, (cmd, host - engine)


def test_a_bad_value_names_its_option() -> None:
    with pytest.raises(UserError, match="--time-budget: must be a finite number"):
        from_options({"time_budget": float("nan")})
    with pytest.raises(UserError, match="--vllm-arg: .* is two arguments"):
        from_options({"vllm_arg": ["--max-model-len 4096"]})
    with pytest.raises(UserError, match="--engine: unknown engine 'tgi'"):
        from_options({"engine": "tgi"}, known={"engine": ("sim", "vllm")})
    assert from_options({"engine": "tgi"}).engine.name == "tgi"  # no registry given: a stored study reads


def test_the_study_stores_the_settings_as_they_are_and_reads_them_back() -> None:
    s = from_options(dict(workload=Path("w.jsonl"), slo=Path("s.yaml"), gpu="h100", model="qwen2.5-7b",
                          strategy="guided", noise=0.03, seed=7, requests_per_run=300, precision=0.1,
                          vllm_arg=["--enforce-eager"], api_key="secret", storage="postgresql://u:pw@h/db"))
    info = StudyInfo(settings=s, workload_sha256="a", workload_requests=1, workload_mean_prompt_tokens=1.0,
                     workload_mean_output_tokens=1.0, slo_sha256="b", slo={}, simulated=True)
    stored = info.model_dump(mode="json")
    assert "secret" not in str(stored) and "pw@" not in str(stored)  # secrets never reach the database
    back = StudyInfo.model_validate(stored).settings
    assert back == s.model_copy(update={"engine": s.engine.model_copy(update={"api_key": None}),
                                        "outputs": s.outputs.model_copy(update={"storage": None})})
    assert back.noise_floor == 0.1  # unset: the knee's precision


def test_a_study_of_the_previous_format_still_reads(tmp_path: Path) -> None:
    """The shipped example study was written with every setting a field of `StudyInfo` (schema 1)."""
    from tuner.storage.reader import load_study_data

    run = tmp_path / "run"
    shutil.copytree(ROOT / "reports" / "chat-rtx4090-qwen2.5-7b", run)
    info = load_study_data(run).info
    assert info.schema_version == 2
    assert (info.settings.engine.name, info.settings.engine.gpu) == ("sim", "rtx4090")
    assert info.settings.workload is not None and info.settings.workload.name == "chat.jsonl"
    assert info.settings.search.strategy in ("twin", "guided")


def test_a_host_joining_a_study_gives_only_its_own_engine_options() -> None:
    study = EngineSettings(name="vllm", model="m", noise=0.0, extra_args=["--enforce-eager"], python="/a/python")
    host = from_options({"vllm_python": "/b/python", "api_key": "k"}).engine
    mine = host_engine(study, host)
    assert (mine.python, mine.api_key, mine.extra_args, mine.model) == ("/b/python", "k", ["--enforce-eager"], "m")
    assert host_engine(study, from_options({"vllm_arg": ["--x=1"]}).engine).extra_args == ["--x=1"]


def test_the_gate_keeps_the_studys_noise_seed_and_host(tmp_path: Path) -> None:
    """`gate.make_engine` used to drop the study's noise, seed and host GPUs."""
    from tuner.engine.registry import spec_of
    from tuner.gate import GateFile, engine_settings

    gate = GateFile(engine="sim", gpu="rtx4090", model="qwen2.5-7b", noise=0.03, seed=5, host_gpus=2,
                    workload={"path": "w", "sha256": "x"}, slo={"path": "s", "sha256": "y"}, capacity_rps=5)
    s = engine_settings(gate, from_options({"time_scale": 2.0}).engine)
    spec = spec_of(s, seed=gate.seed, host_gpus=gate.host_gpus)
    assert (spec.noise, spec.seed, spec.host_gpus, spec.time_scale) == (0.03, 5, 2, 2.0)


def test_the_gate_sizes_load_runs_by_the_engines_clock_not_its_name() -> None:
    from tests.conformance.test_registered_engine import NAME  # a virtual-time engine, not named "sim"
    from tuner.gate import default_load

    assert default_load(NAME) == default_load("sim") != default_load("sim-http")


def test_run_settings_have_one_home_for_each_setting() -> None:
    """No setting is declared twice across the sections (the engine's seed is the run's)."""
    names = [f for sec in ("engine", "load", "knee", "search", "outputs")
             for f in RunSettings.model_fields[sec].annotation.model_fields]
    assert len(names) == len(set(names))


#: Fields that share a setting's name and are another thing: (module:class, field) -> what it is.
NOT_THE_SETTING = {
    ("tuner/engine/sim_http.py:SimHTTPEngine", "name"): "the engine's registry name",
    ("tuner/engine/vllm.py:VllmEngine", "name"): "the engine's registry name",
    ("tuner/fleet/policies.py:RoutingPolicy", "name"): "a routing policy's name",
    ("tuner/profiles/models.py:ModelProfile", "name"): "a model profile's name",
    ("tuner/search/space.py:SearchSpace", "name"): "a search space's name",
    ("tuner/sim/quality.py:StandIn", "noise"): "the simulated answers' logit noise, not launch noise",
    ("tuner/testing/conformance.py:EngineConformance", "request_timeout_s"): "the conformance suite's own",
    ("tuner/report/model.py:Report", "strategy"): "the strategy the study ran ('' where not recorded)",
    ("tuner/replay/record.py:LoadRun", "time_scale"): "a record of the clock the run was measured on",
}


def test_each_settings_default_is_written_in_one_place() -> None:
    """A run setting's default is a literal in one class only: every other model that carries the setting
    (the load run, the gate file, the report, the knee search, the engine spec, the twin) reads it from
    there. Found by reading the source: a literal default under a setting's name anywhere else fails."""
    import ast
    from collections import defaultdict

    from tuner.limits import LoadSpec
    from tuner.settings import KneeOptions, LoadOptions

    names = {f for sec in ("engine", "load", "knee", "search", "outputs")
             for f in RunSettings.model_fields[sec].annotation.model_fields}
    names |= set(RunSettings.model_fields) | set(LoadSpec.model_fields) | set(KneeOptions.model_fields) \
        | set(LoadOptions.model_fields)

    def literal(v: ast.expr) -> bool:
        if isinstance(v, ast.Call) and getattr(v.func, "id", getattr(v.func, "attr", "")) in ("Field", "field"):
            return bool(v.args) and isinstance(v.args[0], ast.Constant) and v.args[0].value is not None
        return isinstance(v, ast.Constant) and v.value is not None

    root = Path(__file__).resolve().parents[2]
    homes: dict[str, list[str]] = defaultdict(list)
    for path in sorted((root / "tuner").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None \
                        and st.target.id in names and literal(st.value):
                    where = f"{path.relative_to(root)}:{node.name}"
                    if (where, st.target.id) not in NOT_THE_SETTING:
                        homes[st.target.id].append(where)
    twice = {k: v for k, v in homes.items() if len(v) > 1}
    assert not twice, twice
