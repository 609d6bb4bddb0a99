"""`tune bench` through the CLI against the HTTP simulator, and the simulator's `/v1/responses`.

Real parts only: the simulator is a subprocess on 127.0.0.1 (`python -m tuner.cli.serve_sim`), `tune bench` another
(`python -m tuner.cli bench`), and the closed-loop cap is checked on the server's side: a thread reads
`vllm:num_requests_running` + `vllm:num_requests_waiting` from its `/metrics` while the run goes on.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.integration.test_sim_server import ROOT, metrics, sim_server, total, words

OUT_TOKENS = 16


@pytest.fixture(scope="module")
def server():
    with sim_server("--max-model-len", "4096") as (base, _):
        yield base


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    p = tmp_path / "w.jsonl"
    p.write_text("".join(json.dumps({"prompt_tokens": 40 + 7 * i, "output_tokens": OUT_TOKENS}) + "\n"
                         for i in range(12)))
    return p


def tune_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner.cli", "bench", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


class InFlightWatcher:
    """Most requests the server held at once (running + waiting), read from its /metrics."""

    def __init__(self, base: str):
        self.base, self.peak, self._stop = base, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=10) as c:
            while not self._stop.is_set():
                m = metrics(c)
                now = total(m, "vllm:num_requests_running") + total(m, "vllm:num_requests_waiting")
                self.peak = max(self.peak, int(now))
                self._stop.wait(0.01)

    def __enter__(self) -> "InFlightWatcher":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def test_bench_closed_loop_never_exceeds_its_concurrency(server, workload, tmp_path):
    out = tmp_path / "result.json"
    with InFlightWatcher(server) as watch:
        p = tune_bench("--url", server, "--workload", str(workload), "--num-prompts", "24",
                       "--max-concurrency", "3", "--json", str(out), "--metric-percentiles", "50,99")
    assert p.returncode == 0, p.stderr
    assert "Serving Benchmark Result" in p.stdout and "Maximum request concurrency:             3" in p.stdout
    assert 2 <= watch.peak <= 3, watch.peak  # the server saw the loop fill, never beyond its cap
    res = json.loads(out.read_text())
    for key in ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                "request_throughput", "output_throughput", "total_token_throughput", "mean_ttft_ms",
                "median_ttft_ms", "p50_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
                "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms", "max_concurrency", "request_rate"):
        assert key in res, key
    assert res["completed"] == 24 and res["failed"] == 0
    assert res["max_concurrency"] == 3 and res["request_rate"] == "inf" and res["max_in_flight"] == 3
    assert res["total_output_tokens"] == 24 * OUT_TOKENS
    assert res["total_input_tokens"] >= 24 * 40  # the server's own count of the prompts
    assert 0 < res["mean_ttft_ms"] < res["mean_e2el_ms"] and res["p99_e2el_ms"] >= res["median_e2el_ms"]
    assert res["mean_tpot_ms"] > 0 and res["mean_itl_ms"] > 0
    assert res["request_throughput"] == pytest.approx(res["completed"] / res["duration"])


def test_bench_open_loop_burst_goes_past_that_concurrency(server, workload):
    """The control: the same burst without the cap puts more than 3 requests on the server at once."""
    with InFlightWatcher(server) as watch:
        p = tune_bench("--url", server, "--workload", str(workload), "--num-prompts", "12")
    assert p.returncode == 0, p.stderr
    assert watch.peak > 3


def test_bench_goodput_against_an_slo(server, workload, tmp_path):
    slo = tmp_path / "slo.yaml"
    slo.write_text("ttft_ms: 60000\ntpot_ms: 60000\n")  # every request is good
    out = tmp_path / "r.json"
    inputs = {f: f.read_bytes() for f in (workload, slo)}
    p = tune_bench("--url", server, "--workload", str(workload), "--num-prompts", "6", "--request-rate", "20",
                   "--slo", str(slo), "--json", str(out), "--save-run", str(tmp_path / "run"))
    assert p.returncode == 0, p.stderr
    # a read-only command (issue 60): its inputs byte for byte as they were, its outputs only where asked
    assert {f: f.read_bytes() for f in inputs} == inputs
    assert sorted(x.name for x in tmp_path.iterdir()) == sorted(["r.json", "run", "slo.yaml", "w.jsonl"])
    res = json.loads(out.read_text())
    assert "Request goodput (req/s):" in p.stdout and "Request rate configured (RPS):" in p.stdout
    assert res["request_goodput"] == pytest.approx(res["request_throughput"])
    # --save-run keeps every request's record, loadable as the same load run
    from tuner.replay.store import load_load_run

    kept = load_load_run(tmp_path / "run")
    assert len(kept.records) == 6 and all(r.ok for r in kept.records)


@pytest.mark.parametrize("args, needle", [
    (["--max-concurrency", "0"], "--max-concurrency: must be >= 1"),
    (["--request-rate", "-1"], "--request-rate: must be a number > 0"),
    (["--arrival", "weekly"], "--arrival: unknown arrival process"),
])
def test_bench_user_errors_are_one_line_and_create_nothing(server, workload, tmp_path, args, needle):
    out = tmp_path / "r.json"
    p = tune_bench("--url", server, "--workload", str(workload), "--json", str(out), *args)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and needle in p.stderr and "Traceback" not in p.stderr
    assert not out.exists()


def test_bench_unreachable_server_is_a_user_error(workload, tmp_path):
    out = tmp_path / "r.json"
    p = tune_bench("--url", "http://127.0.0.1:9", "--workload", str(workload), "--json", str(out))
    assert p.returncode == 2 and p.stderr.startswith("error: --url: cannot read") and not out.exists()


# --- /v1/responses -------------------------------------------------------------------------------------
def events(resp: httpx.Response) -> list[tuple[str, dict]]:
    """(event line, data) of every SSE message of a Responses stream."""
    out, kind = [], None
    for line in resp.iter_lines():
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            out.append((kind, json.loads(line[6:])))
    return out


def test_responses_plain(server):
    text = words(30, "responses")
    with httpx.Client(base_url=server, timeout=30) as c:
        r = c.post("/v1/responses", json={"input": text, "max_output_tokens": 7, "instructions": "be brief"})
        chat = c.post("/v1/chat/completions", json={"messages": [{"role": "system", "content": "be brief"},
                                                                 {"role": "user", "content": text}],
                                                    "max_tokens": 7})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "response" and body["id"].startswith("resp_")
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    msg = body["output"][0]
    assert msg["type"] == "message" and msg["role"] == "assistant"
    part = msg["content"][0]
    assert part["type"] == "output_text" and len(part["text"].split()) == 7
    usage = body["usage"]
    assert usage["output_tokens"] == 7
    # the same messages as a chat request: the same prompt tokens
    assert usage["input_tokens"] == chat.json()["usage"]["prompt_tokens"]
    assert usage["total_tokens"] == usage["input_tokens"] + 7


def test_responses_stream_events(server):
    messages = [{"role": "user", "content": [{"type": "input_text", "text": words(12, "s")}]}]
    with httpx.Client(base_url=server, timeout=30) as c:
        with c.stream("POST", "/v1/responses", json={"input": messages, "max_output_tokens": 5,
                                                     "stream": True}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            evs = events(r)
    kinds = [k for k, _ in evs]
    assert all(k == d["type"] for k, d in evs)  # the event line names the data's type
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds.count("response.output_text.delta") == 5
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [d["sequence_number"] for _, d in evs] == list(range(len(evs)))
    deltas = "".join(d["delta"] for k, d in evs if k == "response.output_text.delta")
    final = evs[-1][1]["response"]
    assert final["output"][0]["content"][0]["text"] == deltas
    assert final["usage"]["output_tokens"] == 5 and final["usage"]["input_tokens"] > 12


@pytest.mark.parametrize("body, status, param", [
    ({"max_output_tokens": 4}, 400, "input"),
    ({"input": "hi", "max_output_tokens": 0}, 400, "max_output_tokens"),
    ({"input": "hi", "model": "nope"}, 404, "model"),
])
def test_responses_errors(server, body, status, param):
    r = httpx.post(server + "/v1/responses", json=body, timeout=30)
    assert r.status_code == status and r.json()["error"]["param"] == param
