"""The self-calibrating twin: its fit recovers an engine it was not told about, its predictions are the
knee search on the fitted simulator, and what it stores is what the report reads.

Every engine here is the in-process simulator (virtual time, deterministic): the "real" one runs cost
parameters moved away from nominal, the twin starts from nominal and sees only the measured load runs.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tuner.capacity.knee import KneeSettings, find_capacity
from tuner.capacity.measure import LoadSettings, measure
from tuner.engine.sim import SimEngine
from tuner.knobs import Knobs
from tuner.sim.costs import CostParams
from tuner.slo import load_slo
from tuner.storage.records import LoadRunSummary, TrialRecord
from tuner.storage.twin import TwinLog, TwinParams
from tuner.twin.engine import TwinEngine
from tuner.twin.fit import FitContext, Observation, kv_scale
from tuner.twin.params import FREE_PARAMS, cost_params, nominal, value
from tuner.twin.twin import Twin
from tuner.workload.loader import load_workload

ROOT = Path(__file__).resolve().parents[2]
GPU, MODEL = "rtx4090", "qwen2.5-7b"
#: A GPU 35% slower at streaming weights and with a heavier scheduler than the profile says.
TRUTH = CostParams(bw_eff=0.45, step_overhead_s=0.004)
LOAD = LoadSettings(requests=200, seed=0, warmup_requests=20)


@pytest.fixture(scope="module")
def chat():
    return load_workload(ROOT / "workloads" / "chat.jsonl"), load_slo(ROOT / "workloads" / "chat.slo.yaml")


def _launch_record(engine, knobs: Knobs, workload, slo, number: int = 0) -> TrialRecord:
    """What a study stores for one launch: its knee search's load runs and the metrics at the knee."""
    server = engine.launch(knobs)
    with server:
        r = find_capacity(server, workload, slo, start_rate=1.0, load=LOAD, knee=KneeSettings(precision=0.05),
                          max_num_seqs=server.cfg.max_num_seqs)
    return TrialRecord(number=number, knobs=knobs.set_only(), launched=True, kv_cache_tokens=server.info.kv_cache_tokens,
                       load_runs=sorted(r.points, key=lambda p: p.rate), capacity_rps=r.capacity,
                       knee_metrics=r.fail_digest or r.pass_digest)


@pytest.fixture(scope="module")
def truth_baseline(chat):
    wl, slo = chat
    return _launch_record(SimEngine(GPU, MODEL, cost_params=TRUTH, token_times=False), Knobs(), wl, slo)


def _small_batch_step(p: CostParams) -> float:
    """Seconds of one decode step of 4 sequences at 1,000 tokens of context each."""
    from tuner.profiles.gpus import get_gpu
    from tuner.profiles.models import get_model
    from tuner.sim.config import resolve
    from tuner.sim.costs import CostModel

    return CostModel(resolve(get_gpu(GPU), get_model(MODEL), Knobs()), p).step_time(0, 0.0, 0, 4, 4000, 4)


def test_nominal_twin_is_the_simulator():
    """Unset parameters are the simulator's own: the nominal twin prices a step exactly as the engine."""
    p = cost_params(nominal())
    assert p == CostParams()
    assert value(TwinParams(), "bw_eff") == CostParams().bw_eff
    assert [f.name for f in FREE_PARAMS][:5] == ["bw_eff", "gemm_eff", "attn_eff", "step_overhead_s",
                                                 "per_seq_overhead_s"]


def test_client_overhead_adds_to_ttft_and_e2e_not_to_tpot(chat):
    wl, slo = chat
    runs = {}
    for o in (0.0, 0.1):
        eng = TwinEngine(GPU, MODEL, nominal().model_copy(update={"client_overhead_s": o}))
        with eng.launch(Knobs()) as server:
            m, _ = measure(server, wl, slo, 2.0, LoadSettings(requests=100, sequential=False), seed=0, salt=1)
        runs[o] = m.summary
    assert runs[0.1].p50_ms["ttft"] - runs[0.0].p50_ms["ttft"] == pytest.approx(100.0, abs=1.0)
    assert runs[0.1].p50_ms["e2el"] - runs[0.0].p50_ms["e2el"] == pytest.approx(100.0, abs=1.0)
    assert runs[0.1].p50_ms["tpot"] == pytest.approx(runs[0.0].p50_ms["tpot"], rel=1e-6)


def test_the_twin_keeps_token_times_exactly_when_the_slo_judges_itl(chat):
    """`TwinEngine.for_slo`, the one way the fit, the anchors and the predictions build the twin: an ITL
    threshold needs each token's time, any other SLO runs without the lists."""
    wl, slo = chat
    itl = slo.model_copy(update={"itl": slo.tpot or slo.ttft})
    for s, want in ((slo, slo.itl is not None), (itl, True)):
        eng = TwinEngine.for_slo(GPU, MODEL, nominal(), s)
        with eng.launch(Knobs()) as server:
            m, _ = measure(server, wl, s, 2.0, LoadSettings(requests=20, sequential=False), seed=0, salt=1)
        assert s.needs_token_times is want and eng.token_times is want
        assert any(r.token_times for r in m.records) is want


def test_kv_scale_is_what_the_host_reserved(chat):
    wl, slo = chat
    ctx = FitContext(GPU, MODEL, wl, slo, LOAD)
    from tuner.profiles.gpus import get_gpu
    from tuner.profiles.models import get_model
    from tuner.sim.config import resolve

    full = resolve(get_gpu(GPU), get_model(MODEL), Knobs()).kv_cache_tokens
    obs = Observation(trial=0, knobs=Knobs(), points=[], kv_cache_tokens=full // 2)
    assert kv_scale(ctx, [obs]) == pytest.approx(0.5, rel=0.01)
    eng = TwinEngine(GPU, MODEL, nominal(kv_scale=0.5))
    assert eng.launch(Knobs()).cfg.kv_cache_tokens == pytest.approx(full / 2, rel=0.01)


def test_fit_recovers_an_engine_it_was_not_told_about(chat, truth_baseline):
    """Fitted to one launch of the slower engine, the twin's loss falls well below the nominal one, its
    decode floor moves toward the truth's, and it predicts that launch's capacity within 10%."""
    wl, slo = chat
    twin = Twin.build(GPU, MODEL, wl, slo, LOAD, fit_trials=30)
    res = twin.refit([truth_baseline])
    assert res is not None and res.trials == [0]
    assert res.loss < 0.5 * res.nominal_loss
    assert set(res.residuals) >= {"p50_tpot", "p99_ttft"}
    # a slower weight stream and a heavier step are one sum at one configuration: what one launch
    # identifies is the step at a small batch, and it moves toward the truth's
    one = {name: _small_batch_step(p) for name, p in
           (("fit", cost_params(res.params)), ("truth", TRUTH), ("nominal", CostParams()))}
    assert abs(math.log(one["fit"] / one["truth"])) < abs(math.log(one["nominal"] / one["truth"]))
    pred = twin.predict(Knobs(), start_rate=truth_baseline.capacity_rps)
    nominal_pred = Twin.build(GPU, MODEL, wl, slo, LOAD).predict(Knobs(), start_rate=1.0)
    assert pred.capacity_rps == pytest.approx(truth_baseline.capacity_rps, rel=0.10)
    # the nominal simulator is the faster GPU: it overestimates, the fit corrects most of that
    assert nominal_pred.capacity_rps > truth_baseline.capacity_rps * 1.1
    assert pred.curve and pred.binding


def test_a_launch_without_load_runs_is_no_observation():
    assert Observation.from_record(TrialRecord(number=3, launched=False)) is None
    assert Observation.from_record(TrialRecord(number=3, launched=True)) is None


def test_twin_log_round_trips_and_keeps_only_the_top_of_a_ranking():
    from tuner.storage.twin import Prediction, Ranking

    preds = [Prediction(knobs={"max_num_seqs": i}, capacity_rps=float(100 - i)) for i in range(60)]
    log = TwinLog(ranking=Ranking(after_trial=0, predictions=preds),
                  predicted_before_launch={preds[1].key: preds[1]})
    back = TwinLog.read({"twin": log.dump()})
    assert len(back.ranking.predictions) == 40
    assert back.predicted_before_launch[preds[1].key].capacity_rps == 99.0
    assert back.ranking.get({"max_num_seqs": 0}).capacity_rps == 100.0


def test_the_twin_judges_a_scaled_slo_with_the_same_percentiles(chat):
    from tuner.twin.anchor import scaled_slo

    _, slo = chat
    s = scaled_slo(slo, 1.5)
    assert s.ttft.max_ms == pytest.approx(1.5 * slo.ttft.max_ms) and s.tpot.max_ms == pytest.approx(1.5 * slo.tpot.max_ms)
    assert s.ttft.percentile == slo.ttft.percentile and s.target == slo.target
    assert scaled_slo(slo, 1.0) is slo


def test_the_anchor_puts_the_twins_knee_of_a_launched_configuration_where_it_was_measured(chat, truth_baseline):
    """Fitted and anchored (its SLO, then its capacities), the twin's own knee of the baseline is the
    measured one within its 3% bracket, whatever constant bias in latency its structure leaves."""
    wl, slo = chat
    twin = Twin.build(GPU, MODEL, wl, slo, LOAD, fit_trials=12)
    res = twin.refit([truth_baseline])
    assert 0.2 <= res.params.slo_scale <= 5.0 and 0.5 <= res.params.capacity_scale <= 2.0
    pred = twin.predict(Knobs(), start_rate=truth_baseline.capacity_rps)
    assert pred.capacity_rps == pytest.approx(truth_baseline.capacity_rps, rel=0.04)
    assert [r for r, _ in pred.curve] and max(r for r, _ in pred.curve) >= pred.capacity_rps  # launches' scale


def test_the_capacity_scale_is_the_launches_measured_over_predicted():
    from tuner.twin.anchor import capacity_scale

    anchors = [("a", 10.0), ("b", 20.0), ("c", 5.0)]
    twin_says = {"a": 8.0, "b": 25.0, "c": None}   # c: the twin predicts no capacity, no anchor
    scale = capacity_scale(anchors, lambda k, rate: twin_says[k])
    assert scale == pytest.approx(((10 / 8) * (20 / 25)) ** 0.5)
    assert capacity_scale([("a", 10.0)], lambda k, rate: 1.0) == 2.0   # clipped: no rescue of a bad fit
    assert capacity_scale([("c", 5.0)], lambda k, rate: None) == 1.0


def _run(rate: float, e2e_ms: float, tpot_ms: float, ttft_ms: float) -> LoadRunSummary:
    return LoadRunSummary(rate=rate, served_rps=rate, verdict="meets", n=100, attainment=1.0, ci_low=0.9,
                          ci_high=1.0, passed=True, goodput=rate,
                          p50_ms={"e2el": e2e_ms, "tpot": tpot_ms, "ttft": ttft_ms})


def test_the_start_read_off_a_launch_scales_the_decode_step_and_gives_the_slope_to_each_sequence():
    """Measured TPOT: 20 ms + 0.7 ms a sequence; the twin's replay of the same runs: 10 ms + 0.1 ms. The
    fixed step cost and the weight stream (8 ms) are one sum to a single launch: both scale to the
    measured intercept, in the proportion they had; the slope left over goes to the per-sequence cost."""
    from tuner.twin.start import decode_start, tpot_line

    pairs = []
    for rate, batch in ((2.0, 2.0), (8.0, 8.0), (16.0, 20.0)):
        e2e = 1000 * batch / rate
        pairs.append((_run(rate, e2e, 20.0 + 0.7 * batch, 50.0), _run(rate, e2e, 10.0 + 0.1 * batch, 25.0)))
    a, b = tpot_line(pairs, 0)
    assert a == pytest.approx(0.020) and b == pytest.approx(0.0007)
    base, weights = nominal(), 0.008
    start = decode_start(base, pairs, weight_time_s=weights)
    step0, step = value(base, "step_overhead_s"), value(start, "step_overhead_s")
    weights_after = weights * value(base, "bw_eff") / value(start, "bw_eff")
    rest = 0.010 - step0 - weights                       # the twin's intercept beyond the two (attention)
    assert step + weights_after == pytest.approx(0.020 - rest)
    assert step / weights_after == pytest.approx(step0 / weights)
    f = step / step0
    per_seq0 = value(base, "per_seq_overhead_s")
    assert value(start, "per_seq_overhead_s") + (0.0001 - per_seq0) * f == pytest.approx(0.0007)
    # one batch size says nothing of a slope: no start
    assert decode_start(base, pairs[:1], weights) is None


def test_the_start_read_off_a_launch_scales_the_client_and_the_prefill_to_the_light_runs_ttft():
    from tuner.twin.start import prefill_start

    pairs = [(_run(r, 1000.0, 20.0, 50.0 + r), _run(r, 1000.0, 20.0, 25.0 + r / 2)) for r in (2.0, 8.0)]
    base = nominal()
    start = prefill_start(base, pairs)   # the 2 req/s run: 52 ms measured, 26 ms replayed
    for name in ("gemm_eff", "attn_eff"):
        assert value(start, name) == pytest.approx(value(base, name) / 2)
    assert value(start, "client_overhead_s") == pytest.approx(2 * value(base, "client_overhead_s"))
    assert value(start, "step_overhead_s") == value(base, "step_overhead_s")


def test_the_start_read_off_a_launch_finds_a_per_sequence_cost_the_nominal_point_lacks(chat):
    """An engine whose step costs 0.4 ms a sequence (50x nominal): the start read off its launch carries
    most of that slope and replays the launch's latencies better than the nominal point does. (Not its
    verdicts: the knee search puts runs within a precision step of the knee, where a twin a few percent
    slow fails a run the engine passed; the fit's later steps, not the start, settle those.)"""
    from tuner.twin.fit import loss_of, replay, weight_time
    from tuner.twin.start import decode_start

    wl, slo = chat
    rec = _launch_record(SimEngine(GPU, MODEL, cost_params=CostParams(per_seq_overhead_s=4e-4)), Knobs(), wl, slo)
    obs = Observation.from_record(rec)
    ctx = FitContext(GPU, MODEL, wl, slo, LOAD)
    pairs: list = []
    def latencies(terms):
        return [t for t in terms if t[0] != "verdict"]

    nominal_loss = loss_of(latencies(replay(ctx, nominal(), obs, pairs)))
    start = decode_start(nominal(), pairs, weight_time(ctx, nominal(), Knobs()))
    assert start is not None
    assert 1.5e-4 < value(start, "per_seq_overhead_s") < 8e-4
    assert loss_of(latencies(replay(ctx, start, obs))) < nominal_loss / 2


def test_a_run_the_engine_kept_up_with_and_the_twin_did_not_is_a_clipped_term_not_a_skipped_one():
    """A twin too slow for every run (its requests time out) must not score better than one whose
    latencies are merely off: the served rate alone cannot tell them apart."""
    from tuner.twin.fit import CLIP, _terms, loss_of

    measured = _run(4.0, 8000.0, 30.0, 80.0)
    timed_out = _run(4.0, 119000.0, 1000.0, 90000.0).model_copy(update={"verdict": "errors"})
    near = _run(4.0, 9000.0, 33.0, 90.0)
    bad = _terms(measured, timed_out)
    assert ("verdict", CLIP) in bad and not any(n.startswith("p50_") for n, _ in bad)
    good = _terms(measured, near)
    assert not any(n == "verdict" for n, _ in good)
    assert loss_of(bad) > loss_of(good)
    # an overloaded measurement against a twin that kept up: the same
    over = measured.model_copy(update={"verdict": "overloaded"})
    assert ("verdict", CLIP) in _terms(over, near)
    # a measured run cut too short decides nothing: no verdict term
    assert not any(n == "verdict" for n, _ in _terms(measured.model_copy(update={"verdict": "too_short"}), timed_out))


def test_a_fit_gain_under_the_minimum_is_kept_but_is_not_progress():
    from tuner.twin.fit import PATIENCE_MIN_GAIN, progress
    assert progress(0.5, None)
    assert progress(0.1813 * (1 - 2 * PATIENCE_MIN_GAIN), 0.1813)
    assert not progress(0.1778, 0.1813)   # the main job's refit: 1.9% after trial 22 (2026-12-05)
    assert not progress(0.19, 0.1813)



def test_a_fit_of_two_launches_is_the_same_on_one_process_and_on_two(chat, truth_baseline, monkeypatch):
    """The fit's replays go to the workers launch by launch (`tuner.twin.fit.fit`): the nominal point and
    each generation's lone first member split across both cores once there are two launches. The terms
    come back in launch order, so every loss, the parameters and the replay count are those of one process."""
    wl, slo = chat
    second = _launch_record(SimEngine(GPU, MODEL, cost_params=TRUTH, token_times=False),
                            Knobs(max_num_seqs=64), wl, slo, number=1)
    fits = {}
    for workers in ("1", "2"):
        monkeypatch.setenv("TUNER_TWIN_WORKERS", workers)
        twin = Twin.build(GPU, MODEL, wl, slo, LOAD, fit_trials=12)
        first = twin.refit([truth_baseline])
        refit = twin.refit([truth_baseline, second])
        assert first is not None and refit is not None and refit.trials == [0, 1]
        fits[workers] = [(f.loss, f.nominal_loss, f.params, f.replays, f.residuals) for f in (first, refit)]
    assert fits["1"] == fits["2"]


def test_a_candidate_keeps_only_the_knobs_the_twin_predicts_to_matter(chat):
    """`simplest`: on the chat workload the nominal twin's candidate loses the knobs that change nothing
    here (gpu_memory_utilization 0.91 against the default 0.9, a batch cap of 512 that 128 never reached)
    and keeps the one that carries its gain; the knob left costs, without it, more than a kept knob must
    bring."""
    from tuner.recommend import share_needed
    from tuner.search.strategies.twin import simplest

    wl, slo = chat
    twin = Twin.build(GPU, MODEL, wl, slo, LOAD)
    floor = 0.05
    cand = twin.predict(Knobs(max_num_batched_tokens=8192, max_num_seqs=512, gpu_memory_utilization=0.91),
                        start_rate=1.0)
    out = simplest(twin, cand, lambda k: k, lambda p: False, floor, {}, start_rate=1.0)
    assert out.knobs == {"max_num_batched_tokens": 8192}
    assert out.capacity_rps * (1 + share_needed("max_num_seqs", floor)) >= cand.capacity_rps
    base = twin.predict(Knobs(), start_rate=1.0)
    assert (base.capacity_rps or 0.0) * (1 + share_needed("max_num_batched_tokens", floor)) < out.capacity_rps
    # a drop that lands on a configuration already launched is not taken: the candidate stays new
    seen = simplest(twin, cand, lambda k: k, lambda p: p.knobs == {"max_num_batched_tokens": 8192}, floor, {},
                    start_rate=1.0)
    assert len(seen.knobs) == 2 and seen.knobs["max_num_batched_tokens"] == 8192
