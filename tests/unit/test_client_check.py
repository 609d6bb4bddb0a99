"""A load run's own truth about itself (`tuner.replay.check`) and a served rate never above offered."""

from __future__ import annotations

import pytest

from tuner.capacity.verdict import judge
from tuner.metrics.parse import E2EL, TTFT
from tuner.metrics.window import HistogramDelta, MetricsWindow
from tuner.replay.check import bound_ms, check_run
from tuner.replay.record import LoadRun, RequestRecord
from tuner.slo import SLO


def _run(n: int = 100, *, late_s: float = 0.0, ttft_s: float = 0.012, server_ttft_s: float = 0.010,
         server_count: int | None = None, sim: tuple[float, float] | None = None) -> LoadRun:
    recs = []
    for i in range(n):
        t = i * 0.05
        sent = t + late_s
        recs.append(RequestRecord(index=i, scheduled_s=t, sent_s=sent, first_token_s=sent + ttft_s,
                                  finish_s=sent + ttft_s + 0.08, end_s=sent + ttft_s + 0.08, output_tokens=32,
                                  expected_output_tokens=32, token_times=[sent + ttft_s]))
    count = n if server_count is None else server_count
    mw = MetricsWindow(histograms={TTFT: HistogramDelta(sum=server_ttft_s * count, count=count),
                                   E2EL: HistogramDelta(sum=0.088 * count, count=count)})
    if sim is not None:
        mw.counters = {"sim:step_lateness_seconds": sim[0], "sim:engine_steps": sim[1]}
    return LoadRun(offered_rate=20.0, duration_s=n * 0.05 + 0.1, records=recs, metrics=mw, wall_clock=True,
                   client_runq_s=0.2, client_cpu_s=0.1)


def test_a_run_that_agrees_with_the_server_is_the_servers():
    c = check_run(_run())
    assert not c.client_bound
    assert c.client_ttft_mean_ms == pytest.approx(12.0) and c.server_ttft_mean_ms == pytest.approx(10.0)
    assert "vs the server's own 10 ms" in c.line()


def test_late_sends_make_a_run_the_clients():
    c = check_run(_run(late_s=0.2))
    assert c.client_bound and "late" in c.reasons[0]


def test_a_client_ttft_far_above_the_servers_own_makes_a_run_the_clients():
    c = check_run(_run(ttft_s=0.5, server_ttft_s=0.012))
    assert c.client_bound and "exceeds the server's own 12 ms" in c.reasons[0]
    assert c.line().startswith("client mean TTFT 500 ms vs the server's own 12 ms")


def test_the_bound_is_50_ms_or_5_percent_of_the_slo_ttft():
    assert bound_ms(None) == 50.0 and bound_ms(300) == 50.0 and bound_ms(2000) == 100.0
    c = check_run(_run(ttft_s=0.09, server_ttft_s=0.01), bound_ms(2000))  # 80 ms over, under a 100 ms bound
    assert not c.client_bound


def test_histograms_of_other_traffic_are_not_compared():
    c = check_run(_run(ttft_s=0.5, server_count=400))  # the server counted 4x the client's requests
    assert c.server_ttft_mean_ms is None and not c.client_bound


def test_a_simulator_whose_steps_ran_late_flags_the_run():
    assert check_run(_run(sim=(2.0, 100))).client_bound  # 20 ms late per step on average
    assert not check_run(_run(sim=(0.1, 100))).client_bound  # 1 ms: a quiet host's timer


def test_served_is_never_above_offered_on_a_cut_run_with_connection_errors():
    """The in-flight count falls when requests end in errors; offered minus its slope read above offered."""
    slo = SLO(ttft={"max_ms": 1000}, target=0.9)
    recs = []
    for i in range(400):
        t = i * 0.05
        # early requests linger (a queue), later ones are dropped at once: the in-flight count shrinks
        end = t + (2.0 if i < 200 else 0.01)
        err = None if i < 200 else "connection dropped: reset"
        recs.append(RequestRecord(index=i, scheduled_s=t, sent_s=t, first_token_s=t + 0.5 if err is None else None,
                                  finish_s=end if err is None else None, end_s=end, error=err, output_tokens=8,
                                  expected_output_tokens=8))
    v = judge(recs, slo)
    assert v.offered_rps is not None and v.served_rps is not None
    assert v.departure_rps is not None and v.departure_rps > v.offered_rps  # what was printed before
    assert v.served_rps <= v.offered_rps


def test_a_run_stopped_by_the_sequential_test_prints_the_verdict_that_decided_it():
    """The line of a run stopped early showed the final records' attainment (0.995) under a verdict that
    had failed it (its interval below 0.99 when it decided): the line now carries the deciding figures."""
    from tuner.capacity.measure import summarize
    from tuner.capacity.verdict import Verdict

    slo = SLO(ttft={"max_ms": 1000}, target=0.99)
    recs = [RequestRecord(index=i, scheduled_s=i * 0.05, sent_s=i * 0.05, first_token_s=i * 0.05 + 0.1,
                          finish_s=i * 0.05 + 0.2, end_s=i * 0.05 + 0.2, output_tokens=8, expected_output_tokens=8)
            for i in range(200)]
    run = LoadRun(offered_rate=20.0, duration_s=10.0, records=recs, stopped_s=8.0)
    decided = Verdict(False, True, "misses", n=150, good=140, ci_low=0.88, ci_high=0.97, offered_rps=20.0)
    s = summarize(recs, slo, 20.0, [run], [decided], 10.0)
    assert not s.passed and s.verdict == "misses"
    assert s.n == 150 and s.attainment < slo.target and s.ci_high < slo.target


def test_a_client_bound_flag_voids_a_pass_and_an_unconfirmed_failure_never_a_servers_own():
    from tuner.replay.check import voids

    starved = check_run(_run(late_s=0.2))
    assert voids(starved, True, "meets")           # a pass on fewer sends than asked: the client's
    assert voids(starved, False, "overloaded")     # the server's queue time says nothing of it
    assert not voids(starved, False, "errors")     # failed requests are the server's
    starved.server_queue_mean_ms = 400.0           # the server's own histogram: requests waited
    assert not voids(starved, False, "overloaded") and voids(starved, True, "meets")
    assert not voids(check_run(_run()), True, "meets")


def test_a_client_bound_run_is_measured_again_twice_then_left_as_the_clients():
    from tuner.capacity.measure import CLIENT_BOUND_RERUNS, Measured, rerun_client_bound
    from tuner.capacity.verdict import Verdict

    def measured(bound: bool) -> Measured:
        run = _run(late_s=0.2 if bound else 0.0)
        check_run(run)
        return Measured(run, Verdict(True, True, "meets"), 1.0)

    outcomes = iter([True, True, False])
    dropped: list = []
    seen: list = []
    m = rerun_client_bound(lambda: measured(next(outcomes)), dropped, seen.append)
    assert not m.run.client_check.client_bound and len(dropped) == 2 and len(seen) == 3

    dropped = []
    m = rerun_client_bound(lambda: measured(True), dropped)
    assert m.run.client_check.client_bound and len(dropped) == CLIENT_BOUND_RERUNS + 1
