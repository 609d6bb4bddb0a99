"""What every engine must do for the tuner to trust it, as one test suite run against each engine.

In the style of Optuna's storage test suite (`optuna.testing`), it ships inside the package, so an engine
written outside it (registered with `tuner.engine.registry.register`) runs the same suite: subclass
`EngineConformance` in a pytest file and provide the fixtures below (it needs pytest and httpx).
`EngineConformance` holds the tests; each engine (real vLLM, the in-process simulator, the HTTP
simulator, `tests/conformance/`) has a subclass that provides fixtures. The base class never
names an engine: HTTP tests talk to `server.info.base_url` with httpx, load tests go through
`Server.run_load`, process tests look at `server.process` (pid, pgid, port). A virtual-time engine sets
`http = False` and `subprocess = False` and its HTTP- and process-only tests skip.

A subclass provides:

- `engine` (class-scoped fixture, a `@classmethod` under `@pytest.fixture(scope="class")`): an `Engine`;
  its servers should come up quickly with `base_knobs`.
- `tiny_kv_engine` (class-scoped fixture): an `Engine` whose KV pool holds about two sequences of
  `PREEMPT_PROMPT + PREEMPT_OUTPUT` tokens, launched with `tiny_kv_knobs`, so a burst must preempt.
- `impossible_memory` (fixture): a list of `(engine, knobs, expected kind)` launches that cannot fit.
- `bad_flag_knobs` / `bad_flag_kind` (class attributes): a flag value the engine must refuse.
"""

from __future__ import annotations

import json
import socket
from typing import ClassVar

import httpx
import pytest

from tuner.engine import procs
from tuner.engine.base import LaunchFailure, Server
from tuner.engine.launcher import port_is_free
from tuner.knobs import REFUSED_BY_VLLM, Knobs
from tuner.metrics.window import GENERATION_TOKENS, PREEMPTIONS, PREFIX_HITS, PREFIX_QUERIES, PROMPT_TOKENS
from tuner.workload.model import WorkloadRequest
from tuner.workload.prompts import synthesize_prompt

PREEMPT_PROMPT = 600
PREEMPT_OUTPUT = 200


def needs_http(fn):
    """The test talks HTTP to `info.base_url`; engines with `http = False` skip it."""
    fn._needs_http = True
    return fn


def needs_process(fn):
    """The test inspects the server's process group; engines with `subprocess = False` skip it."""
    fn._needs_process = True
    return fn


def _group_members(pgid: int) -> list[int]:
    return procs.group_members(pgid)


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


class EngineConformance:
    http: ClassVar[bool] = True
    subprocess: ClassVar[bool] = True
    #: The engine reports its KV pool size (`LaunchInfo.kv_cache_tokens`) at launch.
    reports_kv_tokens: ClassVar[bool] = True
    #: The shared server: a small batch cap, so a burst of 16 must queue.
    base_knobs: ClassVar[Knobs] = Knobs(max_num_seqs=4, max_num_batched_tokens=512)
    tiny_kv_knobs: ClassVar[Knobs] = Knobs(max_num_seqs=16, max_num_batched_tokens=1024, max_model_len=1024)
    bad_flag_knobs: ClassVar[Knobs] = REFUSED_BY_VLLM  # past the tool's own check: what the server says
    bad_flag_kind: ClassVar[str] = "bad_flag"
    request_timeout_s: ClassVar[float] = 300.0

    # --- plumbing -----------------------------------------------------------------------------------------

    @pytest.fixture(autouse=True)
    def _capabilities(self, request):
        fn = request.function
        if getattr(fn, "_needs_http", False) and not self.http:
            pytest.skip(f"{type(self).__name__} has no HTTP server (http = False)")
        if getattr(fn, "_needs_process", False) and not self.subprocess:
            pytest.skip(f"{type(self).__name__} runs no server process (subprocess = False)")

    @pytest.fixture(scope="class")
    @classmethod
    def server(cls, engine):
        s = engine.launch(cls.base_knobs)
        yield s
        s.stop()

    @pytest.fixture(scope="class")
    @classmethod
    def tiny_kv_server(cls, tiny_kv_engine):
        s = tiny_kv_engine.launch(cls.tiny_kv_knobs)
        yield s
        s.stop()

    @pytest.fixture(scope="class")
    @classmethod
    def client(cls, server):
        with httpx.Client(base_url=server.info.base_url, headers=server.headers, timeout=120.0) as c:
            yield c

    @pytest.fixture(scope="class")
    @classmethod
    def model(cls, client) -> str:
        return client.get("/v1/models").json()["data"][0]["id"]

    def burst(self, server: Server, requests: list[WorkloadRequest], gap_s: float = 0.0):
        # HTTP engines: sample the gauges often, a short burst on a fast engine lasts about a second
        extra = {"sample_interval_s": 0.05} if self.http else {}
        run = server.run_load(requests, [i * gap_s for i in range(len(requests))],
                              offered_rate=(1 / gap_s if gap_s else 1000.0),
                              request_timeout_s=self.request_timeout_s, **extra)
        errors = [r.error for r in run.records if not r.ok]
        assert not errors, errors[:3]
        assert run.metrics is not None, "the engine gave no server metrics for the run"
        return run

    # --- launch ---------------------------------------------------------------------------------------------

    @needs_http
    def test_launch_is_healthy(self, server, client):
        assert server.info.base_url
        assert client.get("/health").status_code == 200
        assert server.info.startup_s > 0

    def test_launch_reports_kv_pool(self, server):
        if not self.reports_kv_tokens:
            pytest.skip("this engine does not report its KV pool")
        assert server.info.kv_cache_tokens and server.info.kv_cache_tokens > 0
        assert server.info.max_concurrency and server.info.max_concurrency > 0

    @needs_http
    def test_models_lists_the_served_model(self, client, server):
        data = client.get("/v1/models").json()["data"]
        assert data and data[0]["object"] == "model"
        if server.model is not None:
            assert server.model in [m["id"] for m in data]

    # --- the OpenAI API ------------------------------------------------------------------------------------

    @needs_http
    def test_completion(self, client, model):
        body = {"model": model, "prompt": " the time people", "max_tokens": 9, "ignore_eos": True}
        out = client.post("/v1/completions", json=body).json()
        assert out["usage"]["completion_tokens"] == 9 and out["usage"]["prompt_tokens"] > 0
        assert isinstance(out["choices"][0]["text"], str) and out["choices"][0]["finish_reason"] == "length"

    @needs_http
    def test_completion_stream(self, client, model):
        body = {"model": model, "prompt": " the time people", "max_tokens": 12, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
        events, usage = self._sse(client, "/v1/completions", body)
        assert events[-1] == "[DONE]"
        texts = [e["choices"][0]["text"] for e in events[:-1] if isinstance(e, dict) and e.get("choices")]
        assert 1 < len(texts) <= 12  # streamed piece by piece, not in one chunk
        assert usage and usage["completion_tokens"] == 12

    @needs_http
    def test_chat(self, client, model):
        body = {"model": model, "messages": [{"role": "user", "content": "the time people"}],
                "max_tokens": 7, "ignore_eos": True}
        out = client.post("/v1/chat/completions", json=body).json()
        assert out["usage"]["completion_tokens"] == 7
        assert out["choices"][0]["message"]["role"] == "assistant"

    @needs_http
    def test_chat_stream(self, client, model):
        body = {"model": model, "messages": [{"role": "user", "content": "the time people"}],
                "max_tokens": 10, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        events, usage = self._sse(client, "/v1/chat/completions", body)
        deltas = [e["choices"][0]["delta"] for e in events[:-1] if isinstance(e, dict) and e.get("choices")]
        assert deltas and any(d.get("content") for d in deltas)
        assert usage and usage["completion_tokens"] == 10

    @staticmethod
    def _sse(client: httpx.Client, path: str, body: dict):
        events: list = []
        usage = None
        with client.stream("POST", path, json=body) as resp:
            assert resp.status_code == 200, resp.read()
            for line in resp.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    events.append(data)
                    break
                event = json.loads(data)
                usage = event.get("usage") or usage
                events.append(event)
        return events, usage

    def test_token_counts_are_honoured(self, server):
        lengths = [1, 2, 5, 17, 40]
        reqs = [WorkloadRequest(prompt_tokens=30 + 7 * i, output_tokens=n) for i, n in enumerate(lengths)]
        run = self.burst(server, reqs, gap_s=0.05)
        assert [r.output_tokens for r in run.records] == lengths
        assert [r.expected_output_tokens for r in run.records] == lengths
        assert all(r.ttft is not None and r.ttft >= 0 for r in run.records)

    # --- metrics -------------------------------------------------------------------------------------------

    @needs_http
    def test_metric_names_are_present(self, client):
        text = client.get("/metrics").text
        for name in ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_preemptions",
                     "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens",
                     "vllm:generation_tokens", "vllm:time_to_first_token_seconds",
                     "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds"]:
            assert name in text, name
        assert "vllm:kv_cache_usage_perc" in text or "vllm:gpu_cache_usage_perc" in text

    def test_metrics_move_under_load(self, server):
        """A burst of 16 against max_num_seqs=4: the batch fills, a queue forms, KV is used."""
        reqs = [WorkloadRequest(prompt_tokens=200, output_tokens=96) for _ in range(16)]
        run = self.burst(server, reqs)
        m = run.metrics
        assert m.samples, "no gauge samples during the run"
        running = max(s.running for s in m.samples)
        assert 2 <= running <= self.base_knobs.max_num_seqs
        assert max(s.waiting for s in m.samples) > 0
        assert max(s.kv_usage for s in m.samples) > 0
        assert m.counter(GENERATION_TOKENS) == 16 * 96
        assert m.counter(PROMPT_TOKENS) >= 16 * 200 * 0.9
        assert m.counter(PREEMPTIONS) == 0

    def test_prefix_cache_hits_with_a_shared_prompt(self, server):
        shared = synthesize_prompt(640, 0, salt="conformance-shared")
        reqs = [WorkloadRequest(prompt=shared + synthesize_prompt(20, i, salt="tail"), output_tokens=4)
                for i in range(5)]
        run = self.burst(server, reqs, gap_s=0.5)  # spaced: each arrives after the first is cached
        m = run.metrics
        assert m.counter(PREFIX_QUERIES) >= 5 * 640 * 0.9
        # Every request after the first reuses at least most of the 640 shared tokens (block granularity).
        assert m.counter(PREFIX_HITS) >= 4 * 640 * 0.6, m.counters

    def test_preemptions_under_a_tiny_kv_pool(self, tiny_kv_server):
        reqs = [WorkloadRequest(prompt_tokens=PREEMPT_PROMPT, output_tokens=PREEMPT_OUTPUT) for _ in range(8)]
        run = self.burst(tiny_kv_server, reqs)
        m = run.metrics
        assert m.counter(PREEMPTIONS) > 0, m.counters
        assert max(s.kv_usage for s in m.samples) >= 0.8
        assert [r.output_tokens for r in run.records] == [PREEMPT_OUTPUT] * 8  # recomputed, not cut short

    # --- failures -------------------------------------------------------------------------------------------

    def test_bad_flag_value_is_classified(self, engine):
        with pytest.raises(LaunchFailure) as e:
            engine.launch(self.bad_flag_knobs).stop()
        assert e.value.kind == self.bad_flag_kind, e.value.message
        assert e.value.message

    def test_impossible_memory_is_classified(self, impossible_memory):
        for engine, knobs, kind in impossible_memory:
            with pytest.raises(LaunchFailure) as e:
                engine.launch(knobs).stop()
            assert e.value.kind == kind, (knobs, e.value.kind, e.value.message)

    # --- shutdown -------------------------------------------------------------------------------------------

    @needs_process
    def test_clean_shutdown_leaves_nothing(self, engine):
        s = engine.launch(self.base_knobs)
        proc = s.process
        host, port, pgid = proc.host, proc.port, proc.pgid
        assert len(_group_members(pgid)) >= 1 and _port_open(host, port)
        s.stop()
        assert _group_members(pgid) == [], "processes of the server's group are still running"
        assert not _port_open(host, port)

        assert port_is_free(host, port)
        s.stop()  # a second stop is harmless
