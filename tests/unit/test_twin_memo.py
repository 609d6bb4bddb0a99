"""A careful twin prediction is a function of the twin's parameters and the configuration alone, so each is
searched once per fit (`tuner.twin.predict.Memo`): the ranking's refine, the rerank after a refit, the
anchors and the attribution ask for the same ones, from different start rates.

The engine is the in-process simulator at its nominal parameters (virtual time, deterministic).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tuner.twin.predict as predict_mod
from tuner.capacity.measure import LoadSettings
from tuner.knobs import Knobs
from tuner.slo import load_slo
from tuner.twin.predict import Memo, predict
from tuner.twin.twin import Twin
from tuner.workload.loader import load_workload

ROOT = Path(__file__).resolve().parents[2]
GPU, MODEL = "rtx4090", "qwen2.5-7b"
LOAD = LoadSettings(requests=200, seed=0, warmup_requests=20)


@pytest.fixture(scope="module")
def chat():
    return load_workload(ROOT / "workloads" / "chat.jsonl"), load_slo(ROOT / "workloads" / "chat.slo.yaml")


@pytest.fixture
def searches(monkeypatch):
    """Every careful knee search the twin runs, in this process (no worker processes)."""
    monkeypatch.setenv("TUNER_TWIN_WORKERS", "1")
    made: list[str] = []
    real = predict_mod._search

    def counted(params, gpu, model, knobs, *a, **kw):
        made.append(knobs.key())
        return real(params, gpu, model, knobs, *a, **kw)
    monkeypatch.setattr(predict_mod, "_search", counted)
    return made


def test_a_careful_prediction_does_not_depend_on_where_it_starts(chat):
    """It opens with the rate-inf burst and climbs from what that served: asked from 1 req/s or from 40, the
    same knee, the same curve."""
    wl, slo = chat
    twin = Twin.build(GPU, MODEL, wl, slo, LOAD)
    k = Knobs(max_num_seqs=128)
    low, high = (predict(twin.params, twin.gpu, twin.model, k, wl, slo, LOAD, start_rate=r) for r in (1.0, 40.0))
    assert low.capacity_rps and low.capacity_rps == high.capacity_rps
    assert low.curve == high.curve and low.binding == high.binding


def test_the_twin_searches_each_configuration_once_per_fit(chat, searches):
    wl, slo = chat
    twin = Twin.build(GPU, MODEL, wl, slo, LOAD)
    a, b = Knobs(max_num_seqs=128), Knobs(max_num_seqs=64)
    first = twin.predict(a, start_rate=1.0)
    again = twin.predict(a, start_rate=25.0)
    assert searches == [a.key()] and again == first
    pa, pb, pb2 = twin.predict_many([(a, 3.0), (b, 3.0), (b, 9.0)])
    assert searches == [a.key(), b.key()] and pa == first and pb.key == b.key() and pb2 == pb
    assert len(twin.memo) == 2


def test_a_new_capacity_scale_alone_rescales_what_was_searched_and_new_parameters_search_again(chat, searches):
    """The last step of every fit sets `capacity_scale` (`tuner.twin.anchor`): the twin's own knees stand, put
    on the new scale. Any other parameter is a new twin."""
    wl, slo = chat
    twin = Twin.build(GPU, MODEL, wl, slo, LOAD)
    memo, k = Memo(), Knobs(max_num_seqs=128)

    def one(params):
        return memo.predict_many(params, twin.gpu, twin.model, [(k, 1.0)], wl, slo, LOAD)[0]

    base = one(twin.params)
    scaled = one(twin.params.model_copy(update={"capacity_scale": 1.25}))
    assert searches == [k.key()]
    assert scaled.capacity_rps == pytest.approx(1.25 * base.capacity_rps, rel=1e-12)
    assert [x for x, _ in scaled.curve] == pytest.approx([1.25 * x for x, _ in base.curve], abs=1e-4)
    assert [y for _, y in scaled.curve] == [y for _, y in base.curve]
    one(twin.params.model_copy(update={"slo_scale": 1.1}))
    assert searches == [k.key(), k.key()]


def test_a_screen_raced_above_its_knee_ends_after_one_run_below_that_rate(chat):
    """The whole-space screen races a configuration at the best few's capacity first (`_bar`): failing it
    clearly, it is below that rate (`below_rps`), no knee searched; passing, its knee search goes on."""
    from tuner.twin.predict import SCREEN, _bar

    wl, slo = chat
    twin = Twin.build(GPU, MODEL, wl, slo, LOAD)
    k = Knobs(max_num_seqs=128)
    full = predict(twin.params, twin.gpu, twin.model, k, wl, slo, LOAD, start_rate=5.0, fidelity=SCREEN)
    assert full.capacity_rps and full.below_rps is None
    lost = predict(twin.params, twin.gpu, twin.model, k, wl, slo, LOAD, start_rate=5.0, fidelity=SCREEN,
                   race_rate=3 * full.capacity_rps)
    assert lost.capacity_rps is None and lost.below_rps == pytest.approx(3 * full.capacity_rps)
    assert len(lost.curve) == 1 and lost.curve[0][0] == pytest.approx(3 * full.capacity_rps, abs=1e-4)
    won = predict(twin.params, twin.gpu, twin.model, k, wl, slo, LOAD, start_rate=5.0, fidelity=SCREEN,
                  race_rate=full.capacity_rps / 2)
    assert won.below_rps is None and won.capacity_rps and won.capacity_rps >= full.capacity_rps / 2
    assert _bar([full, lost, won], 2) == min(full.capacity_rps, won.capacity_rps) and _bar([lost], 1) is None


def test_the_ranking_is_the_same_on_one_core_and_on_two(chat, monkeypatch):
    """A grid's screens run in chains, each raced at its own bar (`tuner.twin.predict.GRID_CHAINS`): cut by the
    number of cores, one core ranked chat differently from two. Every prediction must be the host's no
    matter how many processes screen them."""
    wl, slo = chat
    choices = {"max_num_seqs": [32, 64, 128, 256], "max_num_batched_tokens": [1024, 2048, 4096, 8192],
               "kv_cache_dtype": ["auto", "fp8"]}
    ranked = {}
    for workers in ("1", "2"):
        monkeypatch.setenv("TUNER_TWIN_WORKERS", workers)
        twin = Twin.build(GPU, MODEL, wl, slo, LOAD)
        ranking = twin.rank(choices, lambda k: True, extra=[Knobs()])
        ranked[workers] = [(p.key, p.capacity_rps, p.below_rps) for p in ranking.predictions]
    assert len(ranked["1"]) == 33 and sum(1 for _, c, _ in ranked["1"] if c) > 20
    assert ranked["1"] == ranked["2"]
