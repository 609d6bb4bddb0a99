"""The guided strategy's decision rules, on hand-made trial records."""

import json

from tuner.knobs import Knobs
from tuner.storage.records import LoadRunSummary, TrialRecord
from tuner.search.strategy import (Budget, LaunchNoise, values_toward, clearly_better_at_same_load, confirm_incumbent,
                                   normalize, replicate_baseline)


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
    assert values_toward(256, values, "up") == [512]
    assert values_toward(256, values, "down") == [128, 64, 32]
    assert values_toward(256, values, "any")[:2] == [128, 512]  # nearest first
    assert values_toward(True, [True, False], "on") == []


def test_default_valued_knobs_are_the_baseline():
    d = {"max_num_seqs": 256, "max_num_batched_tokens": 2048}
    assert normalize(Knobs(max_num_seqs=256, kv_cache_dtype="auto"), d) == Knobs()
    assert normalize(Knobs(max_num_seqs=128), d) == Knobs(max_num_seqs=128)


# -- confirmation launches (the winner's curse) ----------------------------------------------------------

class ScriptedRunner:
    """Stands in for the GPU: each launch of a configuration returns the next scripted capacity."""

    def __init__(self, caps: dict[str, list[float]]):
        self.caps = {k: list(v) for k, v in caps.items()}
        self.launches = 0
        self.roles: list[str] = []

    def evaluate(self, knobs, *, role="candidate", fresh=False, **kw):
        self.launches += 1
        self.roles.append(role)
        key = json.dumps(knobs.set_only(), sort_keys=True)
        return TrialRecord(number=self.launches - 1, role=role, knobs=knobs.set_only(),
                           capacity_rps=self.caps[key].pop(0))


FP8 = '{"kv_cache_dtype": "fp8"}'


def test_the_baseline_is_launched_twice_and_the_lower_estimate_stands():
    r = ScriptedRunner({"{}": [6.9]})
    noise = LaunchNoise()
    base = replicate_baseline(r, TrialRecord(number=0, role="baseline", capacity_rps=8.0), Budget(), noise)
    assert base.capacity_rps == 6.9 and r.roles == ["confirm"]
    assert not noise.negligible  # 8.0 vs 6.9: a noisy engine, so candidates will be confirmed too


def test_a_candidate_whose_second_launch_falls_below_the_incumbent_is_dropped():
    inc = TrialRecord(number=1, capacity_rps=7.0)
    lucky = TrialRecord(number=2, role="candidate", knobs={"kv_cache_dtype": "fp8"}, capacity_rps=8.5)
    r = ScriptedRunner({FP8: [6.5]})
    noise = LaunchNoise()
    noise.add(7.0, 7.5)
    assert confirm_incumbent(r, lucky, Budget(), inc, noise) is None
    r = ScriptedRunner({FP8: [7.2]})
    stands = confirm_incumbent(r, lucky, Budget(), inc, noise)
    assert stands is not None and stands.capacity_rps == 7.2  # the lower of the two launches


def test_no_confirmation_launch_on_a_deterministic_engine_nor_without_budget():
    inc = TrialRecord(number=1, capacity_rps=7.0)
    cand = TrialRecord(number=2, role="candidate", knobs={"kv_cache_dtype": "fp8"}, capacity_rps=8.5)
    quiet = LaunchNoise()
    quiet.add(7.0, 7.0)
    r = ScriptedRunner({FP8: []})
    assert confirm_incumbent(r, cand, Budget(), inc, quiet) is cand and r.launches == 0
    noisy = LaunchNoise()
    noisy.add(7.0, 7.7)
    spent = ScriptedRunner({FP8: []})
    spent.launches = 15
    # an unconfirmed lucky draw is no result to end a study on
    assert confirm_incumbent(spent, cand, Budget(max_trials=15), inc, noisy) is None


def test_a_batch_cap_above_the_running_batch_is_not_proposed() -> None:
    """Decode-bound at 7 running sequences: max_num_seqs 128 or 64 changes nothing; 8 may."""
    from tuner.storage.records import Diagnosis
    from tuner.search.strategy import narrowed

    diag = Diagnosis(kind="decode", summary="", evidence={"running_p90": 7}, knobs=["max_num_seqs"],
                     directions={"max_num_seqs": "down"})
    assert narrowed("max_num_seqs", [128, 64, 16, 8, 4], "down", diag, {}, None) == [8, 4]
    assert narrowed("max_num_seqs", [512], "up", diag, {}, None) == [512]  # raising the cap is another question
    assert narrowed("max_num_batched_tokens", [512], "down", diag, {}, None) == [512]
    assert narrowed("max_num_seqs", [64], "down", None, {}, None) == [64]
