"""The quality check against the HTTP simulator over real HTTP (issue 38): the reference, the noise floor,
a knob whose stated logit noise moves the answers, the task check's paired counts, and a server whose
`--max-logprobs` is below the check's 20 (said once; every later launch is marked not measured)."""

from __future__ import annotations

from pathlib import Path

from tuner.engine.sim_http import SimHTTPEngine
from tuner.knobs import Knobs
from tuner.quality import study_check
from tuner.slo import SLO
from tuner.workload.model import Workload, WorkloadRequest

WL = Workload(name="q", source_format="tuner",
              requests=[WorkloadRequest(prompt_tokens=60 + i, output_tokens=8) for i in range(12)])


def _slo(tmp_path: Path, tasks: bool = False) -> tuple[SLO, Path]:
    path = tmp_path / "slo.yaml"
    q: dict = {"prompts": 12, "answer_tokens": 8, "max_kl": 0.01}
    if tasks:
        # the simulator's text is its fixed word list: " the of and ..." for every prompt
        (tmp_path / "tasks.jsonl").write_text('{"prompt": "a", "regex": "^ the of"}\n'
                                              '{"prompt": "b", "expected": "nope", "max_tokens": 3}\n')
        q.update(tasks="tasks.jsonl", max_accuracy_drop=0.5)
    return SLO(ttft={"max_ms": 1000}, quality=q), path


def test_reference_floor_and_a_diverging_knob_with_the_task_check(tmp_path):
    slo, path = _slo(tmp_path, tasks=True)
    check = study_check(WL, slo, path, {}, simulated=True)
    engine = SimHTTPEngine("rtx4090", "qwen2.5-7b", run_dir=tmp_path / "servers")
    refs: list = []
    out = []
    for knobs in (Knobs(), Knobs(), Knobs(kv_cache_dtype="fp8")):
        with engine.launch(knobs) as server:
            out.append(check.run(server, knobs.set_only(), len(out), refs[0] if refs else None, refs.append))
    ref, floor, fp8 = out
    assert ref.status == "reference" and refs[0].task_correct == [True, False]
    assert floor.floor and floor.kl_mean == 0.0 and floor.top1_agreement == 1.0 and floor.rejected is None
    assert fp8.kl_mean > 0.01 and fp8.top1_agreement < 1.0 and fp8.simulated
    assert fp8.rejected and fp8.rejected.startswith("KL ")
    assert fp8.tasks is not None and fp8.tasks.items == 2 and fp8.tasks.only_baseline == 0
    assert fp8.positions == 12 * 8


def test_a_server_without_enough_logprobs_is_said_once(tmp_path):
    slo, path = _slo(tmp_path)
    said: list[str] = []
    check = study_check(WL, slo, path, {}, simulated=True, say=said.append)
    engine = SimHTTPEngine("rtx4090", "qwen2.5-7b", run_dir=tmp_path / "servers", extra_args=["--max-logprobs", "5"])
    refs: list = []
    out = []
    for knobs in (Knobs(), Knobs(kv_cache_dtype="fp8"), Knobs(kv_cache_dtype="fp8_e5m2")):
        with engine.launch(knobs) as server:
            out.append(check.run(server, knobs.set_only(), len(out), refs[0] if refs else None, refs.append))
    assert out[0] is None and not refs
    assert len(said) == 1 and "greater than max allowed: 5" in said[0]
    for r in out[1:]:
        assert r.status == "not_measured" and "greater than max allowed: 5" in r.reason and r.rejected is None
