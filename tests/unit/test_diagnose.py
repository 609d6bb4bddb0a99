"""Each binding constraint of REFERENCE.md section 2, produced on a simulator scenario built to show it,
and the knob the guided strategy turns next is the one the table names."""

import numpy as np
import optuna
import pytest

from tuner.diagnose import KNOBS, diagnose
from tuner.engine.sim import SimEngine
from tuner.knobs import Knobs
from tuner.capacity.knee import KneeSettings
from tuner.capacity.measure import LoadSettings
from tuner.search.runner import TrialRunner
from tuner.search.space import load_space
from tuner.search.strategies.guided import guided
from tuner.search.strategy import Budget
from tuner.settings import from_options
from tuner.study import engine_defaults
from tuner.slo import SLO
from tuner.workload.model import Workload, WorkloadRequest

optuna.logging.set_verbosity(optuna.logging.WARNING)


def workload(pin, pout, n=300, seed=0, sigma=0.3):
    rng = np.random.default_rng(seed)
    p = np.clip(rng.lognormal(np.log(pin), sigma, n), 8, None).astype(int)
    o = np.clip(rng.lognormal(np.log(pout), sigma, n), 2, None).astype(int)
    return Workload(name="t", source_format="tuner",
                    requests=[WorkloadRequest(prompt_tokens=int(a), output_tokens=int(b)) for a, b in zip(p, o)])


def slo(**ms):
    return SLO(**{k: {"max_ms": v} for k, v in ms.items()})


SCENARIOS = {
    # vLLM defaults on each; the workload and SLO make one resource bind
    "batch_cap": ("rtx4090", "qwen2.5-7b", workload(128, 128), slo(ttft=3000, tpot=200)),
    "kv_capacity": ("rtx4090", "qwen2.5-7b", workload(1500, 1000), slo(ttft=3000, tpot=100)),
    "decode": ("rtx4090", "qwen2.5-7b", workload(256, 256), slo(ttft=2000, tpot=30)),
    "prefill": ("rtx4090", "qwen2.5-7b", workload(2000, 64), slo(ttft=1000, tpot=200)),
    "queue": ("h100", "llama-3.1-8b", workload(128, 64), slo(ttft=250, tpot=200)),
}


def runner_for(gpu, model, wl, s):
    study = optuna.create_study(direction="maximize")
    opts = from_options({"gpu": gpu, "model": model})
    return TrialRunner(study=study, engine=SimEngine(gpu, model), workload=wl, slo=s,
                       space=load_space("default"), load=LoadSettings(requests=600),
                       knee=KneeSettings(), defaults=engine_defaults(opts), start_rate=1.0)


@pytest.mark.parametrize("kind", list(SCENARIOS))
def test_each_constraint_is_diagnosed_and_its_knob_is_turned_next(kind):
    runner = runner_for(*SCENARIOS[kind])
    guided(runner, Budget(max_trials=3), noise_floor=0.05)
    trials = runner.study.get_trials()
    # a baseline with a capacity is launched twice (like every incumbent), then the diagnosed knob turns
    base = trials[0].user_attrs["record"]
    assert base["diagnosis"]["kind"] == kind, base["diagnosis"]
    ev = base["diagnosis"]["evidence"]
    assert ev["rate"] > 0 and "kv_usage_p90" in ev  # the evidence carries the numbers
    expected = next(k for k in KNOBS[kind][0] if k in runner.space.knobs)
    nxt = next(t.user_attrs["record"] for t in trials[1:] if t.user_attrs["record"]["role"] == "candidate")
    assert nxt["changed_knob"] == expected
    direction = KNOBS[kind][1][expected]
    default = runner.defaults.get(expected)
    value = nxt["knobs"][expected]
    if direction == "up":
        assert value > default
    elif direction == "down":
        assert value < default


def test_diagnosis_reads_real_vllm_metrics_fixture_shapes():
    """The batch-cap and KV-bound captures of real vLLM read as such (digest fields as /metrics gives)."""
    from tuner.storage.records import LoadRunSummary, MetricsDigest

    point = LoadRunSummary(rate=5, n=100, attainment=0.9, ci_low=0.85, ci_high=0.94, passed=False,
                           goodput=4.5, binding="ttft")
    cap = MetricsDigest(running_p90=8, waiting_p90=8, waiting_mean=8, kv_usage_p90=0.30, kv_usage_max=0.3,
                        max_num_seqs=8)
    kv = MetricsDigest(running_p90=2, waiting_p90=18, waiting_mean=18, kv_usage_p90=1.0, kv_usage_max=1.0,
                       preemptions=28, max_num_seqs=64)
    assert diagnose(point, cap).kind == "batch_cap"
    assert diagnose(point, kv).kind == "kv_capacity"


def test_a_failed_baseline_launch_teaches_its_lesson():
    wl, s = workload(256, 128), slo(ttft=2000, tpot=200)
    runner = runner_for("rtx4090", "qwen2.5-7b", wl, s)
    rec = runner.evaluate(Knobs(gpu_memory_utilization=0.7))
    assert rec.launch_failure_kind == "max_model_len"
    assert rec.diagnosis.kind == "launch_failure"
    assert rec.diagnosis.knobs[0] == "max_model_len" and rec.diagnosis.directions["max_model_len"] == "down"
    assert runner.study.get_trials()[0].state == optuna.trial.TrialState.FAIL
