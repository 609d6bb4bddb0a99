"""The replay client against a real HTTP server (tests/helpers/openai_server.py in a subprocess).

The machine is small and shared, so timing assertions use medians with a few ms of slack for the client's
own overhead, and lateness bounds that a closed-loop or blocked client would miss by hundreds of ms.
"""

import json
import math
import signal
import subprocess
import sys
import time
from statistics import median

import pytest

from tests.helpers.openai_server import ROOT, start_server
from tuner.metrics.window import REQUEST_SUCCESS
from tuner.replay.client import CANCELLED, CAP_ERROR, run_load_http
from tuner.replay.store import load_load_run, save_load_run
from tuner.workload.model import ChatMessage, WorkloadRequest

TTFT, TPOT = 0.05, 0.01


@pytest.fixture(scope="module")
def server():
    with start_server(ttft=TTFT, tpot=TPOT) as srv:
        yield srv


def _reqs(n, out=10, prompt=None, tokens=30):
    if prompt is not None:
        return [WorkloadRequest(prompt=prompt, output_tokens=out) for _ in range(n)]
    return [WorkloadRequest(prompt_tokens=tokens, output_tokens=out) for _ in range(n)]


def _new_server_requests(srv, since):
    return [r for r in srv.requests() if r["t"] >= since]


def test_ttft_and_tpot_match_the_server_and_request_forces_length(server):
    t_start = time.monotonic()
    n = 30
    run = run_load_http(server.base_url, _reqs(n), [i * 0.04 for i in range(n)], offered_rate=25)
    assert not run.warnings, run.warnings
    ok = [r for r in run.records if r.ok]
    assert len(ok) == n
    ttfts = [r.ttft for r in ok]
    tpots = [r.tpot for r in ok]
    # the client's own overhead is a few ms on a quiet machine; a busy 2-core CI machine adds tens
    assert TTFT <= median(ttfts) <= TTFT + 0.03
    assert abs(median(tpots) - TPOT) <= 0.002
    assert abs(median(x for r in ok for x in r.itls) - TPOT) <= 0.002
    for r in ok:
        assert r.output_tokens == 10 and len(r.token_times) == 10
        assert r.token_times[0] == r.first_token_s and r.finish_s >= r.token_times[-1]
        assert r.prompt_tokens == 30  # from the usage block (the server counts words)
        assert r.in_window
    seen = _new_server_requests(server, t_start)
    assert len(seen) == n
    for s in seen:
        assert s["path"] == "/v1/completions" and s["model"] == "test-model"
        assert s["max_tokens"] == 10 and s["min_tokens"] == 10 and s["ignore_eos"] is True
        assert s["stream"] is True and s["stream_options"] == {"include_usage": True}
    # Server metrics: the window holds exactly this run's completions, samples saw requests running.
    assert run.metrics is not None
    assert run.metrics.counter(REQUEST_SUCCESS) == n
    assert run.metrics.samples and max(s.running for s in run.metrics.samples) >= 1
    assert run.started_unix and abs(run.started_unix - time.time()) < 30


def test_500_dropped_and_stalled_streams_are_errors(server):
    reqs = _reqs(8)
    reqs[1] = WorkloadRequest(prompt="a [fail:500]", output_tokens=10)
    reqs[3] = WorkloadRequest(prompt="a [fail:drop]", output_tokens=10)
    reqs[5] = WorkloadRequest(prompt="a [fail:stall]", output_tokens=10)
    t = time.monotonic()
    run = run_load_http(server.base_url, reqs, [i * 0.02 for i in range(8)], offered_rate=50,
                        stall_timeout_s=0.5, metrics=False)
    elapsed = time.monotonic() - t
    errs = {r.index: r.error for r in run.records if r.error}
    assert set(errs) == {1, 3, 5}
    assert errs[1].startswith("HTTP 500")
    assert errs[3].startswith("connection dropped")
    assert errs[5].startswith("stalled")
    assert not any(run.records[i].ok for i in (1, 3, 5))
    assert all(run.records[i].ok for i in (0, 2, 4, 6, 7))
    assert run.records[3].output_tokens == 2 and run.records[5].first_token_s is not None
    assert elapsed < 5  # the stall was cut by the stall timeout, not the 120 s total timeout


def test_total_timeout_is_an_error(server):
    run = run_load_http(server.base_url, [WorkloadRequest(prompt="[tpot:0.2]", output_tokens=20)], [0.0],
                        offered_rate=1, request_timeout_s=0.5, stall_timeout_s=5, metrics=False)
    assert run.records[0].error.startswith("timeout")
    assert 1 <= len(run.records[0].token_times) < 20


def test_open_loop_sends_on_schedule_while_the_server_stalls(server):
    # Every request is slow (1 s to first token) and a third of them stall outright: a client that
    # waited for anything would fall behind by seconds.
    n, gap = 40, 0.025
    reqs = [WorkloadRequest(prompt="[fail:stall]" if i % 3 == 0 else "[ttft:1.0]", output_tokens=5)
            for i in range(n)]
    t_start = time.monotonic()
    run = run_load_http(server.base_url, reqs, [i * gap for i in range(n)], offered_rate=1 / gap,
                        stall_timeout_s=1.5, metrics=False)
    # A client that waited for anything would be a second or more late; bounds leave room for a
    # shared machine's scheduling noise.
    late = sorted(r.sent_s - r.scheduled_s for r in run.records)
    assert late[int(0.9 * n)] < 0.010 and late[-1] < 0.1, late
    # The server saw them arrive on the same schedule (CLOCK_MONOTONIC is shared between processes).
    arrivals = sorted(s["t"] for s in _new_server_requests(server, t_start))
    assert len(arrivals) == n
    offsets = sorted(abs(a - arrivals[0] - i * gap) for i, a in enumerate(arrivals))
    assert offsets[int(0.9 * n)] < 0.010 and offsets[-1] < 0.1, offsets
    assert sum(1 for r in run.records if r.ok) == n - len(range(0, n, 3))
    assert all(r.error.startswith("stalled") for r in run.records[::3])


def test_chat_api_first_token_skips_the_role_chunk(server):
    msgs = [ChatMessage(role="system", content="sys"), ChatMessage(role="user", content="hello")]
    reqs = [WorkloadRequest(messages=msgs, output_tokens=6), WorkloadRequest(prompt_tokens=8, output_tokens=6)]
    t_start = time.monotonic()
    run = run_load_http(server.base_url, reqs, [0.0, 0.01], offered_rate=100, api="chat", metrics=False)
    for r in run.records:
        assert r.ok and r.output_tokens == 6 and len(r.token_times) == 6
        assert r.ttft >= TTFT
    seen = _new_server_requests(server, t_start)
    assert {s["path"] for s in seen} == {"/v1/chat/completions"}


def test_api_key_is_sent_as_bearer():
    with start_server(ttft=0.01, tpot=0.001, api_key="sekret") as srv:
        good = run_load_http(srv.base_url, _reqs(2), [0, 0.01], offered_rate=100, api_key="sekret")
        assert all(r.ok for r in good.records)
        assert good.metrics is not None
        bad = run_load_http(srv.base_url, _reqs(2), [0, 0.01], offered_rate=100, api_key="wrong",
                            model="test-model", metrics=False)
        assert all(r.error.startswith("HTTP 401") for r in bad.records)


def test_several_tokens_per_chunk():
    with start_server(ttft=0.02, tpot=0.005, tokens_per_chunk=3) as srv:
        run = run_load_http(srv.base_url, _reqs(3, out=10), [0, 0.01, 0.02], offered_rate=100, metrics=False)
    for r in run.records:
        assert r.ok and r.output_tokens == 10            # from usage
        assert len(r.token_times) == math.ceil(10 / 3)   # one time per chunk


def test_time_scale_stretches_schedule_and_shrinks_durations():
    k = 4.0
    with start_server(ttft=0.2, tpot=0.04, time_scale=k) as srv:
        n, gap = 10, 0.02
        t_start = time.monotonic()
        run = run_load_http(srv.base_url, _reqs(n, out=6), [i * gap for i in range(n)], offered_rate=50,
                            sample_interval_s=0.1)
        arrivals = sorted(s["t"] for s in _new_server_requests(srv, t_start))
    assert run.time_scale == k
    assert [r.scheduled_s for r in run.records] == [i * gap for i in range(n)]
    real_gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert abs(median(real_gaps) - k * gap) < 0.005
    ok = [r for r in run.records if r.ok]
    assert len(ok) == n
    assert 0.05 <= median(r.ttft for r in ok) <= 0.05 + 0.004
    assert abs(median(r.tpot for r in ok) - 0.01) <= 0.001
    assert max(abs(r.sent_s - r.scheduled_s) for r in ok) < 0.005
    assert run.duration_s < 1.0  # ~0.18 s + 0.05 + 5 * 0.01 in server time, about 4x that in real time
    assert all(0 <= s.t <= run.duration_s + 0.2 for s in run.metrics.samples)


def test_in_flight_cap_records_errors_and_keeps_the_schedule(server):
    n = 10
    reqs = _reqs(n, out=2, prompt="[ttft:0.5]")
    run = run_load_http(server.base_url, reqs, [i * 0.01 for i in range(n)], offered_rate=100,
                        max_in_flight=3, metrics=False)
    capped = [r for r in run.records if r.error == CAP_ERROR]
    assert len(capped) == n - 3
    assert all(r.ok for r in run.records[:3])
    assert any("in-flight cap" in w for w in run.warnings)
    assert max(r.sent_s - r.scheduled_s for r in run.records) < 0.1  # capped ones are not delayed


def test_warmup_and_cooldown_window(server):
    n = 11
    run = run_load_http(server.base_url, _reqs(n, out=2), [i * 0.01 for i in range(n)], offered_rate=100,
                        warmup_s=0.02, cooldown_s=0.03, metrics=False)
    assert run.window_start_s == 0.02 and run.window_end_s == pytest.approx(0.07)
    assert [r.in_window for r in run.records] == [False, False] + [True] * 6 + [False] * 3
    assert all(r.ok for r in run.records)  # excluded requests are still sent


def test_progress_and_save_load_roundtrip(server, tmp_path):
    calls = []
    run = run_load_http(server.base_url, _reqs(5), [i * 0.05 for i in range(5)], offered_rate=20,
                        progress=lambda *a: calls.append(a))
    assert calls and calls[-1] == (5, 5, 5)
    assert all(a[1] <= a[0] for a in calls)
    d = save_load_run(run, tmp_path / "run1")
    lines = (d / "records.jsonl").read_text().splitlines()
    assert len(lines) == 5 and json.loads(lines[0])["index"] == 0
    summary = json.loads((d / "summary.json").read_text())
    assert summary["headline"]["ok_in_window"] == 5 and "records" not in summary
    back = load_load_run(d)
    assert back == run
    assert back.metrics.histograms  # float bucket keys, +Inf included, survive JSON
    assert math.inf in back.metrics.histograms["time_to_first_token_seconds"].buckets


def test_ctrl_c_returns_the_partial_run(server):
    proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.interrupt_run", server.base_url, "200", "50"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Wait until some requests went out, then interrupt.
    t_end = time.monotonic() + 30
    while time.monotonic() < t_end:
        line = proc.stderr.readline()
        if line.startswith("SENT") and int(line.split()[1]) >= 45:
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    res = json.loads(out.strip().splitlines()[-1])
    assert res["interrupted"] is True
    assert res["ok"] >= 5
    assert CANCELLED in res["errors"]
    assert set(res["errors"]) <= {None, CANCELLED}
    assert any("interrupted" in w for w in res["warnings"])


def test_bad_arguments_and_unreachable_server_fail_loudly():
    with pytest.raises(ValueError, match="send times"):
        run_load_http("http://127.0.0.1:9", _reqs(2), [0.0], offered_rate=1)
    with pytest.raises(ValueError, match="finite"):
        run_load_http("http://127.0.0.1:9", _reqs(1), [-1.0], offered_rate=1)
    with pytest.raises(ValueError, match="api"):
        run_load_http("http://127.0.0.1:9", _reqs(1), [0.0], offered_rate=1, api="embeddings")
    with pytest.raises(RuntimeError, match="model name"):
        run_load_http("http://127.0.0.1:9", _reqs(1), [0.0], offered_rate=1)
    # With a model given, an unreachable server is measured as errors, with warnings, not an exception.
    run = run_load_http("http://127.0.0.1:9", _reqs(2), [0.0, 0.01], offered_rate=1, model="m")
    assert all(r.error and not r.ok for r in run.records)
    assert run.metrics is None and any("/metrics" in w for w in run.warnings)
