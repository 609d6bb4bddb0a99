"""Stream shapes and metrics plumbing against the real test server: CRLF-framed SSE split across
writes, an error event mid-stream, `scrape()` and the threaded `GaugeSampler`."""

import threading
import time

import httpx

from tests.helpers.openai_server import start_server
from tuner.metrics.parse import RUNNING, TTFT
from tuner.metrics.sampler import GaugeSampler
from tuner.metrics.scrape import scrape, window
from tuner.metrics.window import GENERATION_TOKENS, REQUEST_SUCCESS
from tuner.replay.client import run_load_http
from tuner.workload.model import WorkloadRequest


def test_crlf_events_split_across_network_writes():
    with start_server(ttft=0.02, tpot=0.005, crlf=True) as srv:
        reqs = [WorkloadRequest(prompt_tokens=10, output_tokens=12) for _ in range(3)]
        for api in ("completions", "chat"):
            run = run_load_http(srv.base_url, reqs, [0, 0.01, 0.02], offered_rate=100, api=api, metrics=False)
            for r in run.records:
                assert r.ok, r.error
                assert r.output_tokens == 12 and len(r.token_times) == 12
                assert abs(r.tpot - 0.005) < 0.002


def test_error_event_mid_stream_is_an_error():
    with start_server(ttft=0.01, tpot=0.002, fail_after=3) as srv:
        reqs = [WorkloadRequest(prompt="x [fail:error]", output_tokens=10),
                WorkloadRequest(prompt="fine", output_tokens=10)]
        run = run_load_http(srv.base_url, reqs, [0, 0.005], offered_rate=100, metrics=False)
    bad, good = run.records
    assert bad.error == "server error in stream: injected mid-stream" and not bad.ok
    assert len(bad.token_times) == 3
    assert good.ok


def test_scrape_and_threaded_sampler_follow_the_traffic():
    with start_server(ttft=0.3, tpot=0.01) as srv:
        before = scrape(srv.base_url)
        sampler = GaugeSampler(srv.base_url, interval_s=0.05).start()

        def one():
            body = {"prompt": "hi", "max_tokens": 5, "stream": True}
            with httpx.stream("POST", srv.base_url + "/v1/completions", json=body, timeout=10) as r:
                for _ in r.iter_bytes():
                    pass

        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(0.1)
        samples = sampler.stop()
        after = scrape(srv.base_url)
    assert sampler.errors == 0
    assert len(samples) >= 5
    assert max(s.running for s in samples) == 4  # all four in flight during the 0.3 s TTFT
    assert samples[-1].running == 0
    ts = [s.t for s in samples]
    assert ts == sorted(ts) and ts[0] >= 0
    assert before.gauge(RUNNING) == 0
    w = window(before, after, samples)
    assert w.counter(REQUEST_SUCCESS) == 4 and w.counter(GENERATION_TOKENS) == 20
    assert w.histograms[TTFT].count == 4
