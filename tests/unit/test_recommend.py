"""The recommendation policy (`tuner.recommend`) on hand-made trial records: the simplest configuration
within the noise of the best measured, no output-changing knob without a significant gain, vLLM's
defaults when nothing is significant; and each knob's share of a several-knob step (`tuner.search.attribute`)."""

from __future__ import annotations

import pytest

from tuner.recommend import changed_knobs, effective_floor, launch_spreads, recommend
from tuner.search.attribute import predicted_step, simplify, without
from tuner.knobs import Knobs
from tuner.storage.records import TrialRecord

DEFAULTS = {"max_num_seqs": 256, "max_num_batched_tokens": 2048, "kv_cache_dtype": "auto",
            "gpu_memory_utilization": 0.9, "quantization": None}


def rec(n: int, cap: float | None, **knobs) -> TrialRecord:
    return TrialRecord(number=n, knobs=knobs, launched=True, capacity_rps=cap)


BASE = rec(0, 7.27)
MAIN_JOB_BEST = rec(1, 7.63, max_num_seqs=1024, max_num_batched_tokens=16384, gpu_memory_utilization=0.95,
                    kv_cache_dtype="fp8")


def test_a_gain_inside_the_noise_floor_keeps_the_defaults():
    """The README's main job as it measured: +4.9% with four knobs (fp8 KV among them), 5% floor."""
    r = recommend([BASE, MAIN_JOB_BEST], BASE, MAIN_JOB_BEST, floor=0.05, defaults=DEFAULTS)
    assert r.kind == "defaults" and r.trial == 0 and r.knobs == {} and r.capacity_rps == 7.27
    assert r.best_trial == 1 and not r.best_significant and r.best_gain_pct == pytest.approx(4.95, abs=0.01)
    assert r.line().startswith("keep vLLM's defaults (trial 0): 7.27 req/s")
    assert "within the 5% noise floor" in r.line()
    assert r.best_line().startswith("best measured, not significant (trial 1): 7.63 req/s (+5.0%)")


def test_a_significant_gain_is_recommended():
    best = rec(1, 8.5, max_num_batched_tokens=512)
    r = recommend([BASE, best], BASE, best, floor=0.05, defaults=DEFAULTS)
    assert r.kind == "tuned" and r.trial == 1 and r.best_line() is None
    assert r.line().startswith("recommended (trial 1): 8.50 req/s (+16.9%) with max_num_batched_tokens=512")


def test_the_simplest_within_noise_of_the_best_is_recommended():
    best = rec(1, 9.0, max_num_seqs=1024, max_num_batched_tokens=512, gpu_memory_utilization=0.95)
    simple = rec(2, 8.8, max_num_batched_tokens=512)
    r = recommend([BASE, best, simple], BASE, best, floor=0.05, defaults=DEFAULTS)
    assert r.trial == 2 and r.kind == "tuned" and r.best_trial == 1 and r.best_significant
    assert r.best_line().startswith("best measured (trial 1)")
    # measured worse beyond the noise: the measured best stands
    worse = rec(2, 8.0, max_num_batched_tokens=512)
    assert recommend([BASE, best, worse], BASE, best, floor=0.05, defaults=DEFAULTS).trial == 1


def test_an_output_changing_knob_needs_a_significant_gain_of_its_own():
    with_fp8 = rec(1, 9.2, max_num_batched_tokens=512, kv_cache_dtype="fp8")
    without_fp8 = rec(2, 8.9, max_num_batched_tokens=512, max_num_seqs=128)
    r = recommend([BASE, with_fp8, without_fp8], BASE, with_fp8, floor=0.05, defaults=DEFAULTS)
    assert r.trial == 2 and "kv_cache_dtype" in r.why  # same knob count, fp8 gains within noise
    big = rec(1, 11.0, max_num_batched_tokens=512, kv_cache_dtype="fp8")
    assert recommend([BASE, big, without_fp8], BASE, big, floor=0.05, defaults=DEFAULTS).trial == 1


def test_a_configuration_launched_twice_counts_its_lower_capacity_and_widens_the_floor():
    a, b = rec(1, 8.0, max_num_batched_tokens=512), rec(2, 7.5, max_num_batched_tokens=512)
    floor = effective_floor(0.05, launch_spreads([BASE, a, b]))
    assert floor == pytest.approx(8.0 / 7.5 - 1)
    r = recommend([BASE, a, b], BASE, a, floor=floor, defaults=DEFAULTS)
    assert r.kind == "defaults"  # 7.5 is +3.2% over 7.27: inside the floor


def test_knobs_set_to_vllms_defaults_are_not_changes():
    assert changed_knobs({"max_num_seqs": 256, "kv_cache_dtype": "auto", "max_num_batched_tokens": 512},
                         DEFAULTS) == ["max_num_batched_tokens"]


def test_defaults_without_a_capacity_recommend_the_best_measured():
    """vLLM's defaults did not fit the host (a 70B model on one GPU): any capacity is a gain."""
    base, tp2 = TrialRecord(number=0, launched=False), rec(1, 8.0, tensor_parallel_size=2)
    r = recommend([base, tp2], base, tp2, floor=0.05, defaults=DEFAULTS)
    assert r.kind == "tuned" and r.trial == 1 and r.gain_pct is None
    assert r.line() == ("recommended (trial 1): 8.00 req/s with tensor_parallel_size=2; vLLM's defaults met "
                        "the SLO at no rate (or did not launch)")


def test_no_capacity_anywhere_is_no_recommendation():
    none = rec(0, None)
    assert recommend([none], none, None, floor=0.05).kind == "none"


def test_shares_of_a_several_knob_step_leave_one_knob_out_and_drop_the_ones_within_noise():
    """A twin in which only max_num_batched_tokens matters: it earns the step, the others are dropped."""
    def predict(knobs: dict, rate: float) -> float:
        return 10.0 if knobs.get("max_num_batched_tokens") == 16384 else 8.0 + 0.1 * len(knobs)

    step = predicted_step(predict, BASE, MAIN_JOB_BEST, floor=0.05)
    shares = {s.knob: s for s in step.knobs}
    assert set(shares) == set(MAIN_JOB_BEST.knobs) and step.predicted_before_rps == 8.0
    tok = shares["max_num_batched_tokens"]
    assert tok.without_knobs == without(MAIN_JOB_BEST.knobs, {}, "max_num_batched_tokens")
    assert tok.predicted_share_pct == pytest.approx(100 * (10.0 - 8.3) / 8.0) and not tok.within_noise
    assert all(shares[k].within_noise and shares[k].predicted_share_pct == 0.0
               for k in ("max_num_seqs", "gpu_memory_utilization", "kv_cache_dtype"))
    knobs, dropped, pred = simplify([(step, BASE, MAIN_JOB_BEST)], MAIN_JOB_BEST, predict, floor=0.05)
    assert knobs == {"max_num_batched_tokens": 16384} and pred == 10.0
    assert sorted(dropped) == ["gpu_memory_utilization", "kv_cache_dtype", "max_num_seqs"]


def test_simplify_predicts_the_chain_of_drops_up_front_with_the_one_at_a_time_result():
    """`predict_many` gets the whole chain (every drop kept) in one call; a drop that is not kept sends
    the rest back to one-at-a-time predictions, and the result is the same as without `predict_many`."""
    def predict(knobs: dict, rate: float) -> float:
        return 10.0 if knobs.get("max_num_batched_tokens") == 16384 else 8.0 + 0.1 * len(knobs)

    step = predicted_step(predict, BASE, MAIN_JOB_BEST, floor=0.05)
    batches: list[int] = []
    singles: list[dict] = []

    def many(asked):
        batches.append(len(asked))
        return [predict(k, r) for k, r in asked]

    def one(knobs: dict, rate: float) -> float:
        singles.append(knobs)
        return predict(knobs, rate)

    alone = simplify([(step, BASE, MAIN_JOB_BEST)], MAIN_JOB_BEST, predict, floor=0.05)
    ahead = simplify([(step, BASE, MAIN_JOB_BEST)], MAIN_JOB_BEST, one, floor=0.05, predict_many=many)
    assert ahead == alone
    # the whole and one configuration per within-noise knob (max_num_batched_tokens is not one), at once;
    # every drop is kept, so nothing is left to predict one at a time
    assert batches == [4] and singles == []

    def doubting(knobs: dict, rate: float) -> float:  # dropping gpu_memory_utilization costs 10%
        return predict(knobs, rate) * (0.9 if "gpu_memory_utilization" not in knobs else 1.0)

    alone = simplify([(step, BASE, MAIN_JOB_BEST)], MAIN_JOB_BEST, doubting, floor=0.05)
    ahead = simplify([(step, BASE, MAIN_JOB_BEST)], MAIN_JOB_BEST, doubting, floor=0.05,
                     predict_many=lambda asked: [doubting(k, r) for k, r in asked])
    assert ahead == alone and "gpu_memory_utilization" in ahead[0]


class _FakeRunner:
    """The trial runner as `attribute` uses it: stored records, evaluate (a launch), the study attribute."""

    def __init__(self, records: list[TrialRecord], measure):
        self.records, self.measure, self.attrs, self.launched = list(records), measure, {}, []
        self.key = lambda knobs: Knobs(**knobs).key()
        self.space = type("S", (), {"layout": staticmethod(lambda k: k)})()
        self.study = type("St", (), {"set_user_attr": lambda _, k, v: self.attrs.__setitem__(k, v)})()

    @property
    def launches(self) -> int:
        return len(self.records)

    def finished_all(self):
        out: dict = {}
        for r in self.records:
            out.setdefault(self.key(r.knobs), []).append(r)
        return out

    def finished(self):
        return {k: v[0] for k, v in self.finished_all().items()}

    def evaluate(self, knobs, *, role: str, changed_knob=None, **_):
        r = TrialRecord(number=len(self.records), knobs=knobs.set_only(), role=role, launched=True,
                        changed_knob=changed_knob, capacity_rps=self.measure(knobs.set_only()))
        self.records.append(r)
        self.launched.append(r)
        return r


def test_attribute_measures_each_share_with_launch_and_confirms_the_simpler_configuration():
    """`--attribute` on the main job's shape of step, with a significant gain: one launch per knob left
    out, measured shares replace the predictions, and the knobs within noise are dropped and confirmed."""
    from tuner.search.attribute import attribute
    from tuner.search.strategy import Budget, Outcome

    best = rec(1, 9.0, max_num_seqs=1024, max_num_batched_tokens=16384, kv_cache_dtype="fp8")
    engine = lambda knobs: 9.0 if knobs.get("max_num_batched_tokens") == 16384 else 7.3  # noqa: E731
    runner = _FakeRunner([BASE, best], engine)
    log = attribute(runner, Budget(max_trials=2), Outcome(BASE, best, "test", [0, 1]), noise_floor=0.05,
                    predict=lambda knobs, rate: engine(knobs), verify=True)
    (step,) = log.steps
    shares = {s.knob: s for s in step.knobs}
    assert {r.role for r in runner.launched} == {"attribute", "simplify"}
    assert shares["max_num_batched_tokens"].measured_share_pct == pytest.approx(100 * (9.0 - 7.3) / 7.27)
    assert shares["kv_cache_dtype"].measured_share_pct == 0.0 and shares["kv_cache_dtype"].within_noise
    simp = log.simplification
    assert simp.knobs == {"max_num_batched_tokens": 16384} and simp.trial == runner.launched[-1].number
    assert runner.attrs["shares"]["simplification"]["trial"] == simp.trial
    # the policy then recommends the measured simpler configuration: fewer knobs, no fp8, within noise
    r = recommend(runner.records, BASE, best, floor=0.05, defaults=DEFAULTS)
    assert r.trial == simp.trial and r.knobs == {"max_num_batched_tokens": 16384}
