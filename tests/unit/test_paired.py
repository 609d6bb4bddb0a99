"""Paired comparison on common windows: the statistics (`tuner.capacity.paired`), the window search on the
shared rate grid (`tuner.capacity.windows`) and the rules that decide on them (`tuner.recommend`)."""

from __future__ import annotations

import math

import pytest

from tuner.capacity.paired import Estimate, capacity, paired_ratio, t975
from tuner.capacity.windows import WindowPlan, _highest_pass, window_seeds
from tuner.recommend import (PairedShare, gain_counts, gain_settled, knob_earns, recommend_earned, removal_order,
                             share_settled)
from tuner.storage.earned import EarnedLog, RemovalStep
from tuner.storage.records import TrialRecord, WindowCapacity


def ws(*caps, seeds=None):
    seeds = seeds or range(len(caps))
    return [WindowCapacity(seed=s, capacity_rps=c) for s, c in zip(seeds, caps)]


def test_t_quantiles_match_the_table_and_fall_toward_normal():
    assert t975(1) == pytest.approx(12.706)
    assert t975(5) == pytest.approx(2.571)
    assert t975(21) == pytest.approx(2.086)  # between table rows: the smaller df (wider interval)
    assert t975(500) == pytest.approx(1.96)
    assert math.isinf(t975(0))


def test_paired_ratio_of_identical_windows_is_exactly_zero_and_not_significant():
    a = ws(6.0, 7.0, 8.0, 6.5)
    e = paired_ratio(a, a)
    assert (e.value, e.low, e.high, e.n) == (0.0, 0.0, 0.0, 4)
    assert not e.significant


def test_paired_ratio_pairs_by_seed_and_removes_what_windows_share():
    """Windows far apart in capacity, a steady 10% between the two configurations: the paired interval is
    tight, where the unpaired capacities' intervals overlap."""
    b = ws(5.0, 8.0, 6.0, 9.0, 7.0)
    a = [WindowCapacity(seed=w.seed, capacity_rps=w.capacity_rps * f) for w, f in
         zip(b, (1.09, 1.11, 1.10, 1.095, 1.105))]
    e = paired_ratio(list(reversed(a)), b)  # the order does not matter: pairs are by seed
    assert e.value == pytest.approx(0.10, abs=0.002)
    assert e.significant and e.low > 0.09
    ca, cb = capacity(a), capacity(b)
    assert ca.low < cb.high  # unpaired, the two would not be told apart


def test_paired_ratio_leaves_out_windows_only_one_was_measured_on():
    a, b = ws(6.0, 7.0, 8.0, seeds=[1, 2, 3]), ws(6.0, 7.0, seeds=[2, 3])
    assert paired_ratio(a, b).n == 2
    assert paired_ratio(a, ws(1.0, seeds=[9])) is None


def test_a_window_without_capacity_counts_as_a_large_difference_and_voids_the_capacity():
    a, b = ws(6.0, 6.0, 6.0), ws(6.0, None, 6.0)
    assert paired_ratio(a, b).value > 1.0
    assert capacity(b) is None
    assert capacity(a).rps == pytest.approx(6.0)


def test_window_seeds_are_fixed_by_the_study_seed_and_disjoint_between_seeds():
    assert window_seeds(0, 12) == window_seeds(0, 12)
    assert not set(window_seeds(0, 12)) & set(window_seeds(1, 12))


def test_the_grid_is_shared_and_its_index_round_trips():
    plan = WindowPlan(seeds=(1,), step=0.025)
    for k in (-40, 0, 17, 80):
        assert plan.index(plan.rate(k)) == k


@pytest.mark.parametrize("start", [0, 5, 9, 10, 11, 30])
def test_highest_pass_finds_the_boundary_from_any_start(start):
    calls = []

    def passed(k):
        calls.append(k)
        return k <= 10

    assert _highest_pass(passed, start, -100, lambda: False) == 10
    assert 10 in calls and 11 in calls  # the pass and the fail above it were both measured


def test_highest_pass_is_none_when_nothing_passes_down_to_the_floor():
    assert _highest_pass(lambda k: False, 5, 0, lambda: False) is None


def est(value, half, n=8):
    return Estimate(value=value, low=value - half, high=value + half, n=n)


def test_gain_counts_needs_the_intervals_lower_end_to_clear_the_floor():
    assert gain_counts(est(0.10, 0.04), 0.05)
    assert not gain_counts(est(0.08, 0.04), 0.05)  # significant, estimate above the floor, interval not
    assert not gain_counts(est(0.08, 0.09), 0.05)  # not significant
    assert not gain_counts(est(0.04, 0.01), 0.05)  # significant, under the floor
    assert not gain_counts(None, 0.05)


def test_an_output_changing_knob_must_be_worth_the_floor_a_neutral_one_only_significant():
    assert knob_earns("max_num_seqs", est(0.03, 0.01), 0.05)
    assert not knob_earns("max_num_seqs", est(0.02, 0.01), 0.05)  # significant, under half the floor
    assert not knob_earns("kv_cache_dtype", est(0.03, 0.01), 0.05)
    assert not knob_earns("kv_cache_dtype", est(0.07, 0.03), 0.05)  # its interval does not clear the floor
    assert knob_earns("kv_cache_dtype", est(0.09, 0.03), 0.05)
    assert not knob_earns("max_num_seqs", est(0.0, 0.0), 0.05)
    assert not knob_earns("max_num_seqs", est(0.005, 0.001), 0.05)  # significant and worthless


def test_settled_comparisons_stop_early_only_when_more_windows_cannot_change_the_answer():
    assert share_settled("max_num_seqs", est(0.0, 0.0, n=4), 0.05)       # identical so far
    assert not share_settled("max_num_seqs", est(0.0, 0.0, n=3), 0.05)   # too few windows
    assert not share_settled("kv_cache_dtype", est(0.06, 0.03, n=5), 0.05)
    assert gain_settled(est(0.12, 0.04, n=4), 0.05)
    assert gain_settled(est(0.01, 0.02, n=4), 0.05)
    assert not gain_settled(est(0.06, 0.03, n=4), 0.05)


def test_removal_order_tries_output_changing_knobs_first_then_the_table_order():
    order = removal_order(["gpu_memory_utilization", "kv_cache_dtype", "max_num_seqs"])
    assert order[0] == "kv_cache_dtype"
    assert order.index("max_num_seqs") < order.index("gpu_memory_utilization")


def _rec(n, knobs, caps):
    return TrialRecord(number=n, role="paired", knobs=knobs, launched=True, windows=ws(*caps))


def test_recommend_earned_states_the_reduced_configuration_its_interval_and_each_share():
    d = _rec(2, {}, [6.0, 7.0, 6.5, 6.8])
    x = _rec(3, {"max_num_seqs": 512, "kv_cache_dtype": "fp8"}, [6.6, 7.7, 7.15, 7.48])
    x_no_fp8 = _rec(4, {"max_num_seqs": 512}, [6.0, 7.0, 6.5, 6.8])
    f = _rec(5, {"kv_cache_dtype": "fp8"}, [6.6, 7.7, 7.15, 7.48])
    log = EarnedLog(floor=0.05, test="t", defaults_trials=[2], best_trials=[3], final_trials=[5], steps=[
        RemovalStep(knob="kv_cache_dtype", with_trials=[3], without_trials=[4], kept=True),
        RemovalStep(knob="max_num_seqs", with_trials=[3], without_trials=[5], kept=False)])
    rec = recommend_earned(log, {r.number: r for r in (d, x, x_no_fp8, f)}, 0.05, {})
    assert rec.kind == "tuned" and rec.knobs == {"kv_cache_dtype": "fp8"} and rec.trial == 5
    assert rec.gain_low_pct > 0 and rec.gain_pct == pytest.approx(10.0, abs=0.5)
    assert "95% interval" in rec.line() and "paired" in rec.line()
    fp8, mns = rec.shares
    assert isinstance(fp8, PairedShare) and fp8.kept and fp8.low_pct > 0 and "measured, paired" in fp8.text()
    assert not mns.kept and mns.share_pct == 0.0
    assert rec.ties and "trial 3" in rec.ties[0]


def test_recommend_earned_keeps_the_defaults_when_the_best_gain_is_not_significant():
    d = _rec(2, {}, [6.0, 7.0, 6.5, 6.8])
    b = _rec(3, {"max_num_seqs": 512}, [6.5, 6.6, 6.9, 6.7])
    log = EarnedLog(floor=0.05, test="t", defaults_trials=[2], best_trials=[3])
    rec = recommend_earned(log, {2: d, 3: b}, 0.05, {})
    assert rec.kind == "defaults" and rec.knobs == {}
    assert "not significant" in rec.why
    assert "does not count" in rec.best_line()


def test_a_paired_capacity_is_not_a_launch_to_launch_spread():
    """The knee search's capacity and the paired check's of one configuration are two measures, not two
    launches of one: no spread is read from them (it would raise the older rule's floor)."""
    from tuner.recommend import launch_spreads

    knee = TrialRecord(number=0, role="baseline", knobs={}, launched=True, capacity_rps=7.2)
    paired = TrialRecord(number=2, role="paired", knobs={}, launched=True, capacity_rps=6.5)
    again = TrialRecord(number=3, role="confirm", knobs={}, launched=True, capacity_rps=7.0)
    assert launch_spreads([knee, paired]) == []
    assert [s.capacities for s in launch_spreads([knee, paired, again])] == [[7.2, 7.0]]
