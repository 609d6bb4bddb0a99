"""What the workload and the model already tell is said before any launch (issue 34, item 3): requests
beyond the context counted, refused when they alone break the target, scored without them on request."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.errors import UserError
from tuner.feasibility import check_workload, served_context
from tuner.slo import SLO, load_slo
from tuner.workload.loader import load_workload
from tuner.workload.model import Workload, WorkloadRequest

ROOT = Path(__file__).resolve().parents[2]


def trace(n: int, over: int) -> Workload:
    """`n` requests, `over` of them longer than a 32k context (a Mooncake-like long tail)."""
    reqs = [WorkloadRequest(prompt_tokens=40_000 if i < over else 2_000, output_tokens=200) for i in range(n)]
    return Workload(name="t", source_format="tuner", requests=reqs)


SLO99 = SLO(ttft={"max_ms": 30_000}, tpot={"max_ms": 200}, target=0.99)


def test_overlong_requests_that_alone_break_the_target_refuse_the_study_before_a_launch():
    with pytest.raises(UserError) as e:
        check_workload(trace(2000, 100), SLO99, model="qwen2.5-7b", gpu=None)
    text = str(e.value)
    assert "100 of 2000 requests (5.0%" in text and "32,768-token context" in text
    assert "--drop-overlong" in text and "1900" in text


def test_drop_overlong_scores_the_rest_and_says_how_many():
    pre = check_workload(trace(2000, 100), SLO99, model="qwen2.5-7b", gpu=None, drop_overlong=True)
    assert len(pre.workload.requests) == 1900
    assert any("100 of 2000" in n and "scoring the other 1900" in n for n in pre.notes), pre.notes


def test_the_rag_seed_scenario_is_told_its_overlong_requests_before_a_launch():
    """3 of the 500 RAG requests exceed Qwen2.5-7B's 32k context: 60% of the 1% the target 0.99 lets
    miss, so the study goes on, told so with the count."""
    pre = check_workload(load_workload(ROOT / "workloads" / "rag.jsonl"), load_slo(ROOT / "workloads" / "rag.slo.yaml"),
                         model="qwen2.5-7b", gpu="rtx4090")
    (note,) = [n for n in pre.notes if "context" in n]
    assert note.startswith("pre-flight: 3 of 500 requests (0.6%") and "use 60% of the 1.0%" in note, note
    assert len(pre.workload.requests) == 500


def test_a_longer_context_from_the_server_arguments_or_the_space_is_the_one_checked():
    assert served_context("qwen2.5-7b") == (32_768, "Qwen/Qwen2.5-7B-Instruct's default max_model_len")
    assert served_context("qwen2.5-7b", vllm_args=["--max-model-len=65536"])[0] == 65_536
    assert served_context("an-unknown-model") is None
    assert check_workload(trace(100, 10), SLO99, model="an-unknown-model", gpu=None).notes == []


def test_a_threshold_below_the_floor_is_said_before_a_launch_with_the_prediction_labelled():
    slo = SLO(ttft={"max_ms": 30_000}, tpot={"max_ms": 5}, target=0.99)
    pre = check_workload(trace(200, 0), slo, model="qwen2.5-7b", gpu="rtx4090")
    (note,) = pre.notes
    assert note.startswith("pre-flight (predicted by the cost model): p99 TPOT 5 ms is below the "
                           "single-stream floor of"), note
