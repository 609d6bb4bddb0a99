"""Speculative decoding: the knob (vLLM's JSON), the simulator's cost and counters, the diagnosis that
proposes it and the draft-length order, each against vLLM's documented behaviour."""

from __future__ import annotations

import json

import pytest

from tuner.diagnose import diagnose
from tuner.engine.sim import SimEngine
from tuner.errors import UserError
from tuner.failures import LaunchFailure
from tuner.knobs import Knobs
from tuner.profiles.gpus import get_gpu
from tuner.profiles.models import get_model
from tuner.report.build import config_yaml
from tuner.search.space import SearchSpace, load_space
from tuner.search.strategy import narrowed
from tuner.sim.config import resolve
from tuner.sim.costs import CostParams
from tuner.sim.engine import EngineCore, Seq
from tuner.speculative import expected_tokens, gain, measured_acceptance, order_for_batch, per_position
from tuner.storage.records import Diagnosis, LoadRunSummary, MetricsDigest

L8 = "meta-llama/Llama-3.1-8B-Instruct"
EAGLE3 = {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3}
NGRAM2 = '{"method":"ngram","num_speculative_tokens":2}'
NGRAM4 = '{"method":"ngram","num_speculative_tokens":4}'


def test_the_knob_is_vllms_json_in_one_spelling_and_renders_as_its_flag():
    a = Knobs(speculative_config=EAGLE3)
    b = Knobs(speculative_config=json.dumps(dict(reversed(list(EAGLE3.items()))), indent=2))
    assert a == b
    assert a.flags() == ["--speculative-config", json.dumps(EAGLE3, sort_keys=True, separators=(",", ":"))]
    # the --config file writes it as a mapping, which vLLM's loader turns back into the JSON argument
    assert "speculative-config:\n  method: eagle3\n" in config_yaml("m", a.set_only())


@pytest.mark.parametrize("value, words", [
    ('{"method": "lookahead", "num_speculative_tokens": 2}', "not a vLLM speculative method"),
    ('{"method": "ngram"}', "num_speculative_tokens"),
    ('{"method": "eagle3", "num_speculative_tokens": 2}', "needs 'model'"),
    ("ngram", "not a JSON object"),
])
def test_a_bad_config_is_refused_with_the_reason(value, words):
    with pytest.raises(ValueError, match=words):
        Knobs(speculative_config=value)


def test_a_search_space_takes_mappings_and_a_bad_one_names_its_line(tmp_path):
    space = SearchSpace(knobs={"speculative_config": {"values": [None, {"method": "ngram", "num_speculative_tokens": 2}]}})
    assert space.knobs["speculative_config"].values == [None, NGRAM2]
    p = tmp_path / "space.yaml"
    p.write_text("knobs:\n  speculative_config:\n    values:\n      - null\n"
                 "      - {method: ngram, num_speculative_tokens: 0}\n")
    with pytest.raises(UserError) as e:
        load_space(p)
    assert e.value.line == 5 and e.value.field == "knobs.speculative_config"
    with pytest.raises(ValueError, match="fraction 0..1"):
        SearchSpace(knobs={}, spec_acceptance={"ngram": 1.5})


def test_expected_tokens_and_vllms_counter_ratios():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    # vLLM's dashboard: acceptance rate = accepted / draft tokens, mean length = 1 + accepted / drafts
    assert measured_acceptance(10, 30, 15) == (0.5, 2.5)
    assert measured_acceptance(0, 0, 0) == (None, None)


def decode_time_per_token(knobs: Knobs, batch: int, params: CostParams | None = None) -> tuple[float, EngineCore]:
    """Seconds per output token of `batch` identical requests decoding together on an H100."""
    cfg = resolve(get_gpu("h100"), get_model(L8), knobs)
    core = EngineCore(cfg, params)
    for i in range(batch):
        core.add(Seq(rid=i, arrival=0.0, prompt_len=256, output_len=200, hashes=[]))
    now, first_done = 0.0, None
    while core.has_work():
        dur, _ = core.step(now)
        now += dur
        if first_done is None and core.n_dec == batch:
            first_done = now  # every prefill landed: the decode phase starts
    return (now - first_done) / 199, core


def test_speculation_cuts_decode_time_at_batch_1_and_the_gain_shrinks_with_the_batch():
    spec = Knobs(speculative_config=EAGLE3)
    stated = CostParams(spec_acceptance=(("eagle3", 0.7),))
    gains = {}
    for batch in (1, 64, 512):
        plain, _ = decode_time_per_token(Knobs(), batch)
        fast, core = decode_time_per_token(spec, batch, stated)
        gains[batch] = plain / fast
        assert core.pool.num_free == core.cfg.num_gpu_blocks  # every block came back
    assert gains[1] > 1.5, gains  # E(0.7, 3) = 2.53 tokens a step, less the drafter's three passes
    assert gains[1] > gains[64] > gains[512], gains


def test_the_simulators_counters_give_the_stated_acceptance_back():
    _, core = decode_time_per_token(Knobs(speculative_config=EAGLE3), 8, CostParams(spec_acceptance=(("eagle3", 0.6),)))
    rate, length = measured_acceptance(core.spec_drafts, core.spec_draft_tokens, core.spec_accepted)
    assert length == pytest.approx(expected_tokens(0.6, 3), rel=0.03)
    assert rate == pytest.approx((expected_tokens(0.6, 3) - 1) / 3, rel=0.05)
    # and vLLM's rate read back gives the per-position acceptance the simulator was told
    assert per_position(rate, 3) == pytest.approx(0.6, abs=0.02)


@pytest.mark.parametrize("a,k", [(0.0, 1), (0.3, 3), (0.6, 3), (0.9, 5), (1.0, 4)])
def test_vllms_acceptance_rate_is_not_the_per_position_acceptance(a, k):
    rate = (expected_tokens(a, k) - 1) / k  # accepted / draft tokens, as vLLM's dashboard computes it
    assert per_position(rate, k) == pytest.approx(a, abs=1e-6)
    if 0 < a < 1 and k > 1:
        assert rate < a  # the later positions are accepted less: the rate undersells a


def test_requests_of_mixed_lengths_free_every_block_under_speculation():
    cfg = resolve(get_gpu("rtx4090"), get_model(L8), Knobs(speculative_config=NGRAM4, max_num_seqs=64,
                                                        max_model_len=8192))
    core = EngineCore(cfg, CostParams(spec_acceptance=(("ngram", 0.8),)))
    for i in range(400):
        core.add(Seq(rid=i, arrival=0.0, prompt_len=50 + 37 * (i % 29), output_len=1 + 13 * (i % 41), hashes=[]))
    now, done = 0.0, 0
    while core.has_work():
        dur, finished = core.step(now)
        now += dur
        done += len(finished)
        for s in finished:
            assert s.produced == s.output_len
    assert done == 400 and core.pool.num_free == cfg.num_gpu_blocks
    assert core.preemptions > 0  # the pool ran full: the one-token fallback and preemption ran too


def test_methods_the_simulator_does_not_cost_are_refused_before_a_study_and_at_launch():
    draft = '{"method":"draft_model","model":"meta-llama/Llama-3.2-1B","num_speculative_tokens":4}'
    assert SimEngine.unsupported_value({"speculative_config": [None, draft]})[0] == "speculative_config"
    with pytest.raises(LaunchFailure) as e:
        resolve(get_gpu("h100"), get_model(L8), Knobs(speculative_config=draft))
    assert e.value.kind == "unsupported"


def point(p99_tpot: float = 20.0) -> LoadRunSummary:
    return LoadRunSummary(rate=5, n=500, attainment=0.9, ci_low=0.87, ci_high=0.93, passed=False, goodput=4.5,
                          binding="tpot", violations={"tpot": 50}, p99_ms={"tpot": p99_tpot, "ttft": 100.0})


@pytest.mark.parametrize("running, first", [(6, True), (300, None)])
def test_the_diagnosis_proposes_speculation_for_a_decode_bound_knee_at_a_small_batch_only(running, first):
    """vLLM's docs: speculative decoding "reduces inter-token latency" in the memory-bound regime and
    "is not suitable for" high-throughput batches, where verifying the drafts costs more than they save."""
    m = MetricsDigest(running_p90=running, waiting_p90=0, kv_usage_p90=0.3, kv_usage_max=0.3, max_num_seqs=1024)
    d = diagnose(point(), m)
    assert d.kind == "decode"
    if first:
        assert d.knobs[0] == "speculative_config" and d.directions["speculative_config"] == "on"
    else:
        assert "speculative_config" not in d.knobs


def test_draft_lengths_are_ordered_for_the_knee_batch_and_a_measured_rate_wins_over_the_prior():
    assert gain(4, 4, 0.3) > 1 and gain(200, 4, 0.3) < 1  # long drafts of a poor drafter lose at a big batch
    assert order_for_batch([NGRAM4, NGRAM2], 100) == [NGRAM2, NGRAM4]
    diag = Diagnosis(kind="decode", summary="", evidence={"running_p90": 30.0, "spec_acceptance_rate": 0.9})
    # at 30 sequences, with the prior (0.3) two drafts come first; the incumbent measured 0.9 with ngram: four
    assert narrowed("speculative_config", [NGRAM2, NGRAM4, None], "on", diag, {}, None)[0] == NGRAM2
    assert narrowed("speculative_config", [NGRAM2, NGRAM4], "on", diag, {}, NGRAM2)[0] == NGRAM4
