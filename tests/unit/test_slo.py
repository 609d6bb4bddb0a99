"""SLO files load strictly, and a load run is scored per request the way vLLM's --goodput does."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT
from tuner.errors import UserError
from tuner.replay.record import LoadRun, RequestRecord
from tuner.slo import SLO, Threshold, load_slo, score, score_run, wilson_interval


def _yaml(tmp_path: Path, text: str, name: str = "slo.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def rec(i: int, ttft: float = 0.1, gap: float = 0.02, n_out: int = 11, *, error: str | None = None,
        finished: bool = True, in_window: bool = True, stall: float = 0.0, token_times: bool = True,
        scheduled: float | None = None) -> RequestRecord:
    """A streamed request sent at `scheduled` (default i * 0.1 s): first token after `ttft`, then `n_out - 1`
    tokens `gap` apart, the last gap lengthened by `stall`. Times in seconds."""
    sent = i * 0.1 if scheduled is None else scheduled
    times = [sent + ttft + k * gap for k in range(n_out)]
    if stall:
        times[-1] += stall
    return RequestRecord(index=i, scheduled_s=sent, sent_s=sent, first_token_s=times[0],
                         finish_s=times[-1] if finished else None, token_times=times if token_times else None,
                         output_tokens=n_out, expected_output_tokens=n_out, error=error, in_window=in_window)


CHAT = SLO(ttft=Threshold(max_ms=300), tpot=Threshold(max_ms=50))


# --- loading ---------------------------------------------------------------------------------------------


def test_shipped_slo_files_load() -> None:
    chat = load_slo(ROOT / "workloads" / "chat.slo.yaml")
    assert (chat.ttft.max_ms, chat.ttft.percentile, chat.tpot.max_ms) == (300, 99, 50)
    assert (chat.target, chat.peak_rate, chat.headroom) == (0.99, 50, 0.7)
    strict = load_slo(ROOT / "workloads" / "chat-strict.slo.yaml")
    assert (strict.ttft.max_ms, strict.tpot.max_ms) == (500, 25)
    rag = load_slo(ROOT / "workloads" / "rag.slo.yaml")
    assert (rag.ttft.max_ms, rag.tpot.max_ms) == (2000, 100)
    assert load_slo(ROOT / "workloads" / "multitenant.slo.yaml").thresholds.keys() == {"ttft", "tpot", "itl"}


def test_compact_forms_and_defaults(tmp_path: Path) -> None:
    s = load_slo(_yaml(tmp_path, "ttft_ms: 300\ntpot: 50\ne2el: {max_ms: 9000, percentile: 90}\n"))
    assert s.ttft == Threshold(max_ms=300, percentile=99)
    assert s.tpot == Threshold(max_ms=50, percentile=99)
    assert s.e2el.percentile == 90
    assert s.itl is None
    assert s.target == 0.99 and s.headroom == 0.7 and s.peak_rate is None and s.price_per_gpu_hour is None
    assert load_slo(_yaml(tmp_path, "ttft: {max_ms: 300, percentile: 90}\n")).target == 0.9
    assert load_slo(_yaml(tmp_path, "ttft_ms: 300\ntarget: 0.95\nprice_per_gpu_hour: 2.5\n")).target == 0.95


@pytest.mark.parametrize("text,expected", [
    ("ttft_ms: 300\nlatency: 5\n", "slo.yaml:2: latency: unknown field (known: name,"),
    ("ttft: {max_ms: 300}\ntpot:\n  max_ms: -50\n", "slo.yaml:3: tpot.max_ms: must be > 0"),
    ("ttft_ms: -300\n", "slo.yaml:1: ttft_ms: must be > 0"),
    ("ttft: 0\n", "slo.yaml:1: ttft: must be > 0"),
    ("ttft: {max_ms: 300, percentile: 0}\n", "slo.yaml:1: ttft.percentile: must be > 0"),
    ("ttft: {max_ms: 300, percentile: 101}\n", "slo.yaml:1: ttft.percentile: must be <= 100"),
    ("ttft: {max_ms: 300, pct: 99}\n", "slo.yaml:1: ttft.pct: unknown field"),
    ("ttft_ms: 300\nheadroom: 1.5\n", "slo.yaml:2: headroom: must be <= 1"),
    ("ttft_ms: 300\nheadroom: 0\n", "slo.yaml:2: headroom: must be > 0"),
    ("ttft_ms: 300\ntarget: 1.2\n", "slo.yaml:2: target: must be <= 1"),
    ("ttft_ms: 300\npeak_rate: -4\n", "slo.yaml:2: peak_rate: must be > 0"),
    ("ttft_ms: fast\n", "slo.yaml:1: ttft_ms: must be a number"),
    ("ttft: 300\nttft_ms: 200\n", "slo.yaml: give ttft or ttft_ms, not both"),
    ("name: empty\n", "slo.yaml: no thresholds: give at least one of ttft, tpot, itl, e2el"),
    ("ttft: {max_ms: 300\n", "slo.yaml:2: invalid YAML"),
    ("- ttft: 300\n", "slo.yaml:1: expected a mapping"),
    ("", "slo.yaml: empty SLO file"),
])
def test_bad_slo_files_are_one_line_user_errors(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(UserError) as e:
        load_slo(_yaml(tmp_path, text))
    assert e.value.format().startswith(str(tmp_path / expected)), e.value.format()
    assert "\n" not in e.value.format()


def test_missing_slo_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="nope.yaml: no such file"):
        load_slo(tmp_path / "nope.yaml")


# --- scoring ---------------------------------------------------------------------------------------------


def test_a_request_is_good_only_when_every_threshold_holds() -> None:
    records = [
        rec(0),  # 100 ms TTFT, 20 ms TPOT: good
        rec(1, ttft=0.4),  # TTFT broken
        rec(2, gap=0.06),  # TPOT broken
        rec(3, ttft=0.4, gap=0.06),  # both broken: one bad request, counted in both violations
        rec(4, ttft=0.3),  # exactly at the threshold holds
    ]
    s = score(records, CHAT)
    assert (s.n, s.n_good) == (5, 2)
    assert s.attainment == pytest.approx(0.4)
    assert s.violations == {"ttft": 2, "tpot": 2}
    assert s.errors == 0 and not s.meets_target


def test_per_request_is_stricter_than_per_metric_percentiles() -> None:
    # 100 requests: 5 break only TTFT, 5 others break only TPOT. Each metric's p90 passes, yet only 90% are good.
    records = [rec(i, ttft=0.5 if i < 5 else 0.1, gap=0.08 if 5 <= i < 10 else 0.02) for i in range(100)]
    slo = SLO(ttft=Threshold(max_ms=300, percentile=90), tpot=Threshold(max_ms=50, percentile=90))
    s = score(records, slo)
    assert s.percentile_values_ms["ttft"] <= 300 and s.percentile_values_ms["tpot"] <= 50
    assert s.attainment == pytest.approx(0.90)
    assert s.target == 0.9 and s.meets_target
    assert not score(records, slo.model_copy(update={"target": 0.95})).meets_target


def test_failed_unfinished_and_out_of_window_requests() -> None:
    records = [rec(i) for i in range(8)] + [
        rec(8, error="HTTP 500"),
        rec(9, finished=False),  # timed out: sent, never finished
        rec(10, ttft=5.0, in_window=False),  # warm-up: not scored at all
    ]
    s = score(records, CHAT)
    assert s.n == 10
    assert (s.n_good, s.errors) == (8, 2)
    assert s.attainment == pytest.approx(0.8)
    assert s.violations == {"ttft": 0, "tpot": 0} and s.binding is None
    assert s.metrics["ttft"].n == 8  # percentiles are over finished requests only
    assert s.metrics["ttft"].p99_ms == pytest.approx(100)


def test_goodput_window_and_binding_metric() -> None:
    records = [rec(i, scheduled=i * 0.5, ttft=0.5 if i % 4 == 0 else 0.1) for i in range(40)]
    s = score(records, CHAT, window=20.0)
    assert s.n_good == 30
    assert s.goodput == pytest.approx(30 / 20.0)
    assert s.binding == "ttft" and s.violations["ttft"] == 10
    # default window: the send span plus one mean gap, so goodput = attainment x offered rate (2 req/s)
    d = score(records, CHAT)
    assert d.window_s == pytest.approx(20.0)
    assert d.goodput == pytest.approx(0.75 * 2.0)
    run = LoadRun(offered_rate=2.0, duration_s=30, window_start_s=5.0, window_end_s=15.0, records=records)
    assert score_run(run, CHAT).goodput == pytest.approx(3.0)


def test_wilson_interval() -> None:
    lo, hi = wilson_interval(95, 100)
    assert (lo, hi) == (pytest.approx(0.8883, abs=1e-4), pytest.approx(0.9785, abs=1e-4))
    lo, hi = wilson_interval(100, 100)
    assert hi == 1.0 and lo == pytest.approx(1 / (1 + 1.959963984540054 ** 2 / 100))
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(0, 50)[0] == 0.0
    s = score([rec(i) for i in range(19)] + [rec(19, ttft=1.0)], CHAT)
    assert (s.ci_low, s.ci_high) == wilson_interval(19, 20)
    assert s.ci_low < s.attainment < s.ci_high


def test_itl_is_checked_on_each_requests_longest_gap() -> None:
    slo = SLO(itl=Threshold(max_ms=100), tpot=Threshold(max_ms=50))
    stalled = rec(1, n_out=101, stall=0.5)  # one 520 ms stall: mean gap (TPOT) still ~25 ms
    assert stalled.tpot * 1000 < 50
    s = score([rec(0), stalled], slo)
    assert s.n_good == 1
    assert s.violations == {"itl": 1, "tpot": 0}
    assert s.metrics["itl"].n == 10 + 100  # pooled gaps, as vllm bench serve reports ITL


def test_itl_without_token_times_falls_back_to_tpot_with_a_warning() -> None:
    slo = SLO(itl=Threshold(max_ms=100))
    s = score([rec(0, token_times=False), rec(1, gap=0.2, token_times=False)], slo)
    assert s.n_good == 1
    assert any("no token times" in w for w in s.warnings)


def test_empty_window_scores_zero_without_crashing() -> None:
    s = score([rec(0, in_window=False)], CHAT)
    assert (s.n, s.attainment, s.goodput, s.meets_target) == (0, 0.0, None, False)
    assert s.metrics["ttft"].p50_ms is None
    with pytest.raises(UserError, match="window: must be > 0"):
        score([rec(0)], CHAT, window=0)
