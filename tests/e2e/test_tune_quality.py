"""The SLO's quality bound end to end on the HTTP simulator (issue 38): a candidate whose outputs move
further from vLLM's defaults than the bound allows is rejected for that alone, and the report says why.

The simulator states its divergence per knob (`tuner.sim.quality.LOGIT_NOISE`: 0.3 nats of logit noise for
FP8 KV), so the same study without the bound measures the FP8 candidate's capacity (it meets the SLO), and
with the bound rejects it before any load run: quality is the only difference.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import GPU, MODEL, SIM_HTTP_LOAD, SLO, TUNE_FIX, WORKLOAD, tune

pytestmark = pytest.mark.e2e

SPACE = TUNE_FIX / "space-fp8.yaml"
QUALITY_SLO = TUNE_FIX / "tiny-quality.slo.yaml"


def _study(out: Path, slo: Path):
    return tune("--workload", WORKLOAD, "--slo", slo, "--engine", "sim-http", "--gpu", GPU, "--model", MODEL,
                "--search-space", SPACE, "--max-trials", "4", "--strategy", "guided", "--out", out,
                *SIM_HTTP_LOAD, timeout=400)


def _trials(out: Path) -> dict[str, dict]:
    rep = json.loads((out / "report.json").read_text())
    return {json.dumps(t["knobs"], sort_keys=True): t for t in rep["trials"]}, rep


@pytest.mark.slow  # two studies (~3.5 min on 2 busy cores); the default tier's gate test below rejects too
def test_a_candidate_over_the_quality_bound_is_rejected_for_quality_alone(tmp_path: Path) -> None:
    free, bound = tmp_path / "free", tmp_path / "bound"
    p = _study(free, SLO)
    assert p.returncode == 0, p.stderr
    trials, _ = _trials(free)
    fp8 = trials['{"kv_cache_dtype": "fp8"}']
    assert fp8["capacity_rps"], fp8        # without the bound it meets the SLO at some rate
    q = fp8["quality"]
    assert q["status"] == "measured" and q["simulated"] and q["rejected"] is None
    assert q["kl_mean"] > 0.01             # the simulator's stated noise, measured by the check

    p = _study(bound, QUALITY_SLO)
    assert p.returncode == 0, p.stderr
    assert "rejected for output quality: KL" in p.stdout + p.stderr
    trials, rep = _trials(bound)
    fp8 = trials['{"kv_cache_dtype": "fp8"}']
    assert fp8["capacity_rps"] is None and fp8["quality"]["rejected"].startswith("KL ")
    floor = trials["{}"]["quality"] if trials["{}"]["quality"]["status"] == "measured" else None
    assert rep["recommendation"]["kind"] == "defaults"
    md = (bound / "report.md").read_text()
    assert "rejected for output quality: KL" in md and "max_kl 0.01" in md
    assert "Output quality against vLLM's defaults" in md and "SIMULATED" in md
    # the noise floor: the baseline's second launch against its first, the same stand-in answers
    confirm = [t for t in rep["trials"] if t["knobs"] == {} and t["quality"] and t["quality"]["floor"]]
    assert confirm and confirm[0]["quality"]["kl_mean"] == 0.0 and confirm[0]["quality"]["top1_agreement"] == 1.0
    assert floor is None or floor["floor"]


@pytest.mark.slow  # a whole knee search of the unchecked candidate (tests/integration/test_sim_quality.py
#                   covers the same in seconds without the study)
def test_a_server_without_prompt_logprobs_is_said_once_and_the_study_goes_on(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = tune("--workload", WORKLOAD, "--slo", QUALITY_SLO, "--engine", "sim-http", "--gpu", GPU, "--model", MODEL,
             "--search-space", SPACE, "--max-trials", "3", "--strategy", "guided", "--no-confirm", "--out", out,
             "--vllm-arg=--max-logprobs=5", *SIM_HTTP_LOAD, timeout=400)
    assert p.returncode == 0, p.stderr
    said = (p.stdout + p.stderr).count("quality not measured: the server gave no prompt logprobs")
    assert said == 1, p.stdout
    trials, rep = _trials(out)
    fp8 = trials['{"kv_cache_dtype": "fp8"}']
    assert fp8["quality"]["status"] == "not_measured" and "greater than max allowed: 5" in fp8["quality"]["reason"]
    assert fp8["capacity_rps"]             # no quality evidence: no quality rejection, the study went on
    md = (out / "report.md").read_text()
    assert "not measured (the server gave no prompt logprobs" in md


@pytest.mark.slow  # ~50 s, out of the default run for time: the default run's gate tests cover the gate, and the
# real-model tier (tests/integration/test_real_model.py) the bound rejecting a real degradation
def test_the_gate_fails_a_configuration_whose_divergence_exceeds_the_bound(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # the quality verdicts are the subject, not the capacity: a coarse knee (precision 1.0: two runs) and
    # 5 s load runs, which the gate's warm-up and SLO runs take over from the study (its `load`)
    p = tune("--workload", WORKLOAD, "--slo", QUALITY_SLO, "--engine", "sim-http", "--gpu", GPU, "--model", MODEL,
             "--search-space", SPACE, "--max-trials", "2", "--strategy", "guided", "--no-confirm", "--out", out,
             *SIM_HTTP_LOAD, "--precision", "1.0", "--max-run-s", "5", timeout=400)
    assert p.returncode == 0, p.stderr
    assert "rejected for output quality: KL" in p.stdout + p.stderr   # the study rejects it ...
    md = (out / "report.md").read_text()
    assert "rejected for output quality: KL" in md and "max_kl 0.01" in md and "SIMULATED" in md
    assert (out / "quality-reference.json").is_file()
    gate = out / "gate.yaml"
    ok = tune("gate", gate, timeout=300)                                # ... the gate holds the defaults
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "[ok] quality within the bound: KL 0," in ok.stdout
    bad = tune("gate", gate, "--config-override", "kv_cache_dtype=fp8", timeout=300)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "[FAIL] quality BROKEN: KL" in bad.stdout and "> max_kl 0.01" in bad.stdout


def test_a_malformed_task_file_is_file_line_and_exit_2_with_nothing_created(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": "1+1=", "expected": "2"}\n{"prompt": "2+2=", "expected": 4}\n')
    slo = tmp_path / "slo.yaml"
    slo.write_text("ttft: {max_ms: 1000}\nquality: {max_accuracy_drop: 0.05, tasks: tasks.jsonl}\n")
    out = tmp_path / "run"
    p = tune("--workload", WORKLOAD, "--slo", slo, "--engine", "sim", "--gpu", GPU, "--model", MODEL,
             "--out", out, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{tasks}:2" in lines[0] and "expected: must be a string" in lines[0], lines
    assert "Traceback" not in p.stderr and not out.exists()
