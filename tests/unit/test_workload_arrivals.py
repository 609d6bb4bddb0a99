"""Arrival processes: the right mean rate, the right burstiness, repeatable for a seed, traces time-scaled."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import FIXTURES
from tuner.errors import UserError
from tuner.workload.arrivals import gamma_times, poisson_times, schedule, trace_rate, trace_times
from tuner.workload.loader import load_workload
from tuner.workload.synth import synthesize


def _cv(times: list[float]) -> float:
    gaps = np.diff(times)
    return float(gaps.std() / gaps.mean())


def test_poisson_rate_cv_and_seed() -> None:
    t = poisson_times(20_000, rate=8.0, seed=1)
    assert t[0] == 0.0 and all(b >= a for a, b in zip(t, t[1:]))
    assert (len(t) - 1) / t[-1] == pytest.approx(8.0, rel=0.03)
    assert _cv(t) == pytest.approx(1.0, abs=0.05)  # exponential gaps
    assert poisson_times(100, 8.0, seed=1) == poisson_times(100, 8.0, seed=1)
    # rescaled to the nominal span: the run offers exactly the rate it is labelled with (bench serve)
    for seed in range(5):
        short = poisson_times(200, 8.0, seed=seed)
        assert (len(short) - 1) / short[-1] == pytest.approx(8.0, rel=1e-12)
    assert poisson_times(100, 8.0, seed=2) != t[:100]


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_keeps_the_mean_rate_and_sets_the_burstiness(burstiness: float) -> None:
    t = gamma_times(40_000, rate=5.0, burstiness=burstiness, seed=3)
    assert (len(t) - 1) / t[-1] == pytest.approx(5.0, rel=0.04)
    # gamma gaps of shape k have CV 1/sqrt(k): burstier below 1, smoother above
    assert _cv(t) == pytest.approx(1 / np.sqrt(burstiness), rel=0.06)


def test_gamma_with_burstiness_one_is_poisson_in_distribution() -> None:
    a = np.diff(gamma_times(20_000, 4.0, 1.0, seed=5))
    b = np.diff(poisson_times(20_000, 4.0, seed=6))
    assert np.percentile(a, [10, 50, 90]) == pytest.approx(np.percentile(b, [10, 50, 90]), rel=0.06)


def test_trace_times_scale_the_trace_rate() -> None:
    w = load_workload(FIXTURES / "workloads" / "mooncake_trace.jsonl")
    base = trace_times(w)
    assert base == [r.arrival_s for r in w.requests]
    fast = trace_times(w, time_scale=4.0)
    assert fast == pytest.approx([t / 4 for t in base])
    assert trace_rate(w) == pytest.approx((len(base) - 1) / base[-1])


def test_schedule_dispatches_and_drives_a_trace_at_a_target_rate(shared_dir: Path) -> None:
    w = load_workload(shared_dir / "traces" / "azure_llm_2023_conv.csv")
    own = trace_rate(w)
    assert 5.0 < own < 6.0  # the trace README says about 5.5 req/s
    t = schedule(w, rate=2 * own, process="trace")
    assert (len(t) - 1) / (t[-1] - t[0]) == pytest.approx(2 * own)
    assert schedule(w, process="trace", time_scale=2.0) == pytest.approx(t)
    # burst shape survives scaling: same inter-arrival CV
    assert _cv(t) == pytest.approx(_cv(trace_times(w)), rel=1e-9)
    syn = synthesize("chat", 50, seed=0)
    assert schedule(syn, rate=3.0, seed=9) == poisson_times(50, 3.0, seed=9)
    assert schedule(syn, rate=3.0, process="gamma", burstiness=0.5, seed=9) == gamma_times(50, 3.0, 0.5, seed=9)


@pytest.mark.parametrize("kwargs,match", [
    (dict(process="poisson"), "rate: must be a finite number > 0"),
    (dict(rate=-1.0), "rate: must be a finite number > 0"),
    (dict(rate=float("inf")), "rate: must be a finite number > 0"),
    (dict(rate=1.0, process="gamma", burstiness=0.0), "burstiness: must be"),
    (dict(rate=1.0, process="uniform"), "unknown arrival process 'uniform'"),
    (dict(process="trace"), "has no timestamps"),
])
def test_bad_arrival_parameters_are_user_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(UserError, match=match):
        schedule(synthesize("chat", 10, seed=0), **kwargs)


def test_trace_rate_and_time_scale_together_are_refused() -> None:
    w = load_workload(FIXTURES / "workloads" / "mooncake_trace.jsonl")
    with pytest.raises(UserError, match="either a rate or a time_scale"):
        schedule(w, rate=2.0, process="trace", time_scale=3.0)
    with pytest.raises(UserError, match="time_scale: must be"):
        trace_times(w, time_scale=0)
