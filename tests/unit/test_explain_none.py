"""A "no" names the requests that break the SLO and what sets their floor (issue 34, item 3), and never
states a contradiction: every figure it prints is held to the threshold it is printed beside."""

from __future__ import annotations

from tests.helpers.no_lines import contradictions, numbers_in
from tuner.capacity.explain import why_none
from tuner.replay.record import RequestRecord
from tuner.slo import SLO
from tuner.storage.records import LoadRunSummary

AT = "at 0.0133 req/s, 0.058 requests in flight"


def rec(i: int, ttft: float, prompt: int, cached: int | None, *, gaps: list[float] | None = None,
        sent: float = 0.0) -> RequestRecord:
    times = [sent + ttft]
    for g in gaps or [0.03] * 5:
        times.append(times[-1] + g)
    return RequestRecord(index=i, scheduled_s=sent, sent_s=sent, first_token_s=sent + ttft, finish_s=times[-1],
                         token_times=times, prompt_tokens=prompt, output_tokens=len(times),
                         expected_output_tokens=len(times), cached_tokens=cached, end_s=times[-1])


def point(records: list[RequestRecord], binding: str, slo: SLO) -> LoadRunSummary:
    from tuner.capacity.measure import summarize

    s = summarize(records, slo, 0.0133, [], [], 0.0)
    assert s.binding == binding
    return s


def rag_run() -> tuple[list[RequestRecord], SLO]:
    """20 requests whose 20k-token document was cached, 2 whose was not, 1 over the context."""
    warm = [rec(i, 0.2 + 0.03 * i, 22_000, 20_480, sent=10.0 * i) for i in range(20)]
    cold = [rec(20, 2.39, 13_065, 0, sent=200.0), rec(21, 5.27, 25_071, 256, sent=210.0)]
    over = RequestRecord(index=22, scheduled_s=0, sent_s=0, prompt_tokens=32_768, expected_output_tokens=64,
                         error="This model's maximum context length is 32768 tokens", end_s=0)
    return warm + cold + [over], SLO(ttft={"max_ms": 2000, "percentile": 99},
                                       tpot={"max_ms": 100, "percentile": 99}, target=0.99)


def test_a_cold_prefix_tail_is_named_with_its_counts_and_what_would_change_it():
    records, slo = rag_run()
    line = why_none(point(records, "ttft", slo), records, slo, AT)
    assert "p99 TTFT 2000 ms is broken at 0.0133 req/s" in line
    assert "the 2 of 23 requests whose shared prefix was not (or only partly) in the prefix cache" in line
    assert "13,065-24,815 uncached prompt tokens" in line and "TTFT 2.39 s-5.27 s" in line
    assert "the other 20 meet it (p99 " in line and "1 more exceeded the model's context" in line
    for fix in ("kv_cache_dtype fp8", "a target those requests do not decide", "2.6x faster"):
        assert fix in line, fix
    assert contradictions(line) == [], line
    assert "single-stream" not in line  # the median of the warm requests is not the floor that broke it


def test_without_cache_knowledge_the_longest_prompts_are_named():
    records, slo = rag_run()
    for r in records:
        r.cached_tokens = None
    line = why_none(point(records, "ttft", slo), records, slo, AT)
    assert "the 2 of 23 requests with prompts of 13,065-25,071 tokens" in line, line
    assert contradictions(line) == []


def test_an_itl_stall_names_the_prefill_that_shares_the_step():
    """Request 0 decodes while request 1's 2,048-token prompt prefills: its largest gap (250 ms) spans it.
    The pooled p99 ITL (every gap of every request) stays near 30 ms and is not printed as the floor."""
    slo = SLO(ttft={"max_ms": 500}, itl={"max_ms": 200, "percentile": 99}, target=0.99)
    stalled = rec(0, 0.05, 300, 256, gaps=[0.03, 0.03, 0.25, 0.03], sent=0.0)
    prefill = rec(1, 0.2, 2048, 0, sent=0.10)  # prefills from 0.10 to 0.30 s, inside the 250 ms gap
    calm = [rec(i, 0.05, 300, 256, sent=10.0 * i) for i in range(2, 40)]
    records = [stalled, prefill, *calm]
    line = why_none(point(records, "itl", slo), records, slo, AT)
    assert "p99 ITL 200 ms is broken" in line and "the 1 of 40 requests whose decode shared a step with " \
        "another request's prefill of 2,048 uncached prompt tokens (ITL 250 ms; the gap is that step)" in line, line
    assert "a max_num_batched_tokens below 2,048" in line
    assert contradictions(line) == []


def test_the_checker_catches_the_old_contradiction():
    old = ("p99 TTFT 2000 ms is below this engine's single-stream TTFT of 291 ms (median at 0.0156 req/s); "
           "binds: decode (ITL breaks the SLO first (p99 23.5 ms))")
    assert len(contradictions(old)) == 2
    assert contradictions("p99 TPOT 15 ms is below the single-stream floor of 21.5 ms on rtx4090") == []
    assert numbers_in("2 of 23 (1,024 tokens)") == [2, 23, 1024]


def test_a_bound_below_every_request_is_said_as_a_floor_with_its_measured_percentile():
    """The decode floor case (every request over the bound, nothing queued): the engine's own figure at
    the SLO's percentile is printed, and it is above the threshold it is said to be below."""
    slo = SLO(ttft={"max_ms": 2000}, tpot={"max_ms": 15, "percentile": 99}, target=0.99)
    records = [rec(i, 0.05, 500 + 20 * i, 0, gaps=[0.0231 + 0.0001 * (i % 5)] * 9, sent=5.0 * i)
               for i in range(17)]
    line = why_none(point(records, "tpot", slo), records, slo, AT)
    assert line.startswith("p99 TPOT 15 ms is below this engine's single-stream TPOT of 23.") and "17 of 17" in line, line
    assert "(its p99 at 0.0133 req/s, 0.058 requests in flight)" in line
    assert "a target those requests do not decide" not in line
    assert contradictions(line) == []


def test_the_diagnosis_of_an_itl_stall_counts_requests_and_turns_the_token_budget_first():
    """"binds: decode (ITL breaks the SLO first (p99 23.5 ms))" printed a pooled p99 far under the 200 ms
    bound as what broke it; the count of requests whose largest gap broke it is what the SLO judges."""
    from tuner.diagnose import diagnose
    from tuner.storage.records import MetricsDigest

    p = LoadRunSummary(rate=0.186, n=32, attainment=0.906, ci_low=0.76, ci_high=0.97, passed=False, goodput=None,
                       binding="itl", violations={"ttft": 0, "tpot": 0, "itl": 3},
                       p99_ms={"itl": 23.5, "ttft": 257.0, "tpot": 24.7})
    d = diagnose(p, MetricsDigest(running_p90=1, max_num_seqs=256, rate=0.186))
    assert d.kind == "decode" and d.summary == ("ITL breaks the SLO first (3 of 32 requests with their largest "
                                                "inter-token gap over the bound)"), d.summary
    assert d.knobs[0] == "max_num_batched_tokens"
    assert contradictions(f"binds: decode ({d.summary})") == []


def test_a_mixed_tail_counts_each_group_with_its_own_figures():
    """Measured shape (RAG on RTX 4090, 300-request runs): cold prefixes, and a warm request that arrived
    while one of them prefilled."""
    records, slo = rag_run()
    records = records[:-1]
    behind = rec(30, 2.02, 18_170, 17_408, sent=211.0)  # sent while request 21 (sent 210 s, TTFT 5.27 s) prefilled
    records.append(behind)
    line = why_none(point(records, "ttft", slo), records, slo, AT)
    assert ("by the 3 of 23 requests: 2 whose shared prefix was not (or only partly) in the prefix cache "
            "(13,065-24,815 uncached prompt tokens each, TTFT 2.39 s-5.27 s), 1 that arrived while another "
            "request's prefill ran (TTFT 2.02 s)") in line, line
    assert contradictions(line) == []
