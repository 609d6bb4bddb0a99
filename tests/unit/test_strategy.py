"""The guided strategy's decision rules, on hand-made trial records."""

from tuner.knobs import Knobs
from tuner.search.records import LoadRunSummary, TrialRecord
from tuner.search.strategy import _order, clearly_better_at_same_load, normalize


def point(rate, badness, passed=None):
    return LoadRunSummary(rate=rate, n=500, attainment=0.99, ci_low=0.98, ci_high=1.0,
                          passed=badness <= 1 if passed is None else passed, goodput=rate, badness=badness)


def rec(cap, *points):
    return TrialRecord(capacity_rps=cap, load_runs=list(points))


INC = rec(10.0, point(10.0, 0.95), point(10.5, 1.10))


def test_a_tie_is_broken_by_lower_slo_stress_at_the_same_load():
    assert clearly_better_at_same_load(rec(10.0, point(10.0, 0.85), point(10.5, 1.05)), INC)


def test_no_tie_break_for_an_equal_or_marginal_difference_or_a_lower_capacity():
    assert not clearly_better_at_same_load(rec(10.0, point(10.0, 0.95), point(10.5, 1.05)), INC)
    assert not clearly_better_at_same_load(rec(10.0, point(10.0, 0.94), point(10.5, 1.05)), INC, margin=0.02)
    assert not clearly_better_at_same_load(rec(9.5, point(10.0, 0.80)), INC)


def test_better_at_one_load_but_worse_just_above_is_not_better():
    # a tight batch cap: calmer at the incumbent's capacity, collapsing one step above it
    assert not clearly_better_at_same_load(rec(10.0, point(10.0, 0.85), point(10.5, 1.60)), INC)


def test_candidate_order_follows_the_diagnosed_direction():
    values = [32, 64, 128, 256, 512]
    assert _order(256, values, "up") == [512]
    assert _order(256, values, "down") == [128, 64, 32]
    assert _order(256, values, "any")[:2] == [128, 512]  # nearest first
    assert _order(True, [True, False], "on") == []


def test_default_valued_knobs_are_the_baseline():
    d = {"max_num_seqs": 256, "max_num_batched_tokens": 2048}
    assert normalize(Knobs(max_num_seqs=256, kv_cache_dtype="auto"), d) == Knobs()
    assert normalize(Knobs(max_num_seqs=128), d) == Knobs(max_num_seqs=128)
