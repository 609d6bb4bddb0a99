"""The HTTP simulator as a real subprocess on 127.0.0.1: vLLM's API, errors, metrics, timing, start-up.

Each server is started exactly as the sim-http engine starts it (`python -m tuner.cli.serve_sim ...`), and spoken to
over real HTTP; nothing is mocked. Two servers are shared by the module's tests (start-up costs about a
second on a 2-core machine): one with an API key, a served name and a short context; one without a key at
time scale 2 for timing and abort tests (kept idle between tests).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tuner.knobs import Knobs
from tuner.profiles.gpus import get_gpu
from tuner.profiles.models import get_model
from tuner.sim.flags import human_readable_int
from tuner.sim.config import resolve
from tuner.sim.engine import EngineCore, Seq
from tuner.sim.protocol import WORDS
from tuner.tokens import count_tokens

ROOT = Path(__file__).resolve().parents[2]
GPU, MODEL = "rtx4090", "Qwen/Qwen2.5-7B-Instruct"
KEY = "sim-secret"
NAME = "sim-qwen"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def sim_server(*flags: str, env: dict | None = None, port: int | None = None):
    """Run `python -m tuner.cli.serve_sim --gpu GPU --model MODEL *flags` until it answers /health; stop it after."""
    port = port or free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="sim-server-", suffix=".log", delete=False)
    argv = [sys.executable, "-m", "tuner.cli.serve_sim", "--gpu", GPU, "--model", MODEL, "--port", str(port), *flags]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"simulator exited {proc.returncode}: {Path(log.name).read_text()}")
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "simulator not healthy in 30 s"
            time.sleep(0.05)
        yield base, Path(log.name)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.unlink(log.name)


@pytest.fixture(scope="module")
def keyed():
    with sim_server("--max-model-len", "2048", "--served-model-name", NAME, "--time-scale", "0.5",
                    env={"VLLM_API_KEY": KEY}) as (base, _):
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as c:
            yield c


@pytest.fixture(scope="module")
def scaled():
    with sim_server("--max-model-len", "2048", "--time-scale", "2", "--max-num-seqs", "2") as (base, log):
        with httpx.Client(base_url=base, timeout=60) as c:
            yield c


def words(n: int, seed: object) -> str:
    rng = random.Random(str(seed))
    return "".join(rng.choice(WORDS) for _ in range(n))


def metrics(client: httpx.Client) -> dict:
    """{sample name: {frozenset(labels): value}} plus '__types__': {family: type}."""
    text = client.get("/metrics").text
    out: dict = {"__types__": {}}
    for fam in text_string_to_metric_families(text):
        out["__types__"][fam.name] = fam.type
        for s in fam.samples:
            out.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return out


def total(m: dict, name: str, **labels) -> float:
    want = set(labels.items())
    return sum(v for k, v in m.get(name, {}).items() if want <= set(k))


def sse(resp: httpx.Response) -> list:
    """The `data:` payloads of a stream, JSON-decoded except the final `[DONE]`."""
    out = []
    for line in resp.iter_lines():
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


# --- API ----------------------------------------------------------------------------------------------
def test_health_needs_no_key_and_models_reports_time_scale(keyed):
    assert httpx.get(str(keyed.base_url) + "/health").status_code == 200
    assert httpx.get(str(keyed.base_url) + "/v1/models").status_code == 401
    card = keyed.get("/v1/models").json()["data"][0]
    assert card["id"] == NAME and card["max_model_len"] == 2048
    assert card["sim_time_scale"] == 0.5


def test_completion_returns_exactly_max_tokens(keyed):
    prompt = words(37, "plain")
    r = keyed.post("/v1/completions", json={"model": NAME, "prompt": prompt, "max_tokens": 9,
                                            "min_tokens": 9, "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"] == {"prompt_tokens": 37, "completion_tokens": 9, "total_tokens": 46}
    assert count_tokens(body["choices"][0]["text"]) == 9
    assert body["choices"][0]["finish_reason"] == "length"
    # OpenAI's default max_tokens for completions is 16
    r = keyed.post("/v1/completions", json={"prompt": prompt})
    assert r.json()["usage"]["completion_tokens"] == 16


def test_streamed_completion_one_event_per_token_then_usage_and_done(keyed):
    body = {"model": NAME, "prompt": words(20, "s"), "max_tokens": 12, "stream": True,
            "stream_options": {"include_usage": True}}
    with keyed.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse(r)
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12
    tokens = [e["choices"][0] for e in events[:-2]]
    assert len(tokens) == 12 and all(count_tokens(c["text"]) == 1 for c in tokens)
    assert [c["finish_reason"] for c in tokens] == [None] * 11 + ["length"]


def test_chat_streamed_and_not(keyed):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello there"}]
    with keyed.stream("POST", "/v1/chat/completions",
                      json={"messages": messages, "max_tokens": 5, "stream": True}) as r:
        events = sse(r)
    assert events[-1] == "[DONE]"
    deltas = [e["choices"][0]["delta"] for e in events[:-1]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert [count_tokens(d["content"]) for d in deltas[1:]] == [1] * 5
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])

    r = keyed.post("/v1/chat/completions", json={"messages": messages, "max_completion_tokens": 4})
    msg = r.json()["choices"][0]["message"]
    assert msg["role"] == "assistant" and count_tokens(msg["content"]) == 4
    # the template adds role markers, so the prompt counts more tokens than the contents alone
    assert r.json()["usage"]["prompt_tokens"] > count_tokens("You are terse.Hello there")


def test_tokenize_gives_the_ids_the_server_schedules_and_render_is_403_without_scale_out(keyed):
    """What a router reads of a prompt (vLLM's /tokenize, both forms): the ids the server itself schedules,
    so its prefix matches are the prefix cache's; render answers 403 as `vllm serve` without
    --enable-scale-out does (the vLLM Router then has no tokens: tuner.sim.tokenize)."""
    prompt = words(40, "tok")
    r = keyed.post("/tokenize", json={"model": NAME, "prompt": prompt})
    assert r.status_code == 200
    body = r.json()
    assert body["count"] == len(body["tokens"]) == count_tokens(prompt) and body["max_model_len"] == 2048
    served = keyed.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1}).json()
    assert served["usage"]["prompt_tokens"] == body["count"]
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello there"}]
    chat = keyed.post("/tokenize", json={"messages": messages}).json()
    bare = keyed.post("/tokenize", json={"messages": messages, "add_generation_prompt": False}).json()
    assert bare["tokens"] == chat["tokens"][:bare["count"]] and bare["count"] < chat["count"]
    answered = keyed.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1}).json()
    assert answered["usage"]["prompt_tokens"] == chat["count"]
    assert keyed.post("/tokenize", json={"model": "other", "prompt": "hi"}).status_code == 404
    assert keyed.post("/tokenize", json={"prompt": 3}).status_code == 400
    r = keyed.post("/v1/completions/render", json={"prompt": prompt})
    assert r.status_code == 403 and "--enable-scale-out" in r.json()["error"]["message"]


def test_render_answers_the_token_ids_with_enable_scale_out():
    prompt = words(30, "render")
    with sim_server("--enable-scale-out") as (base, _):
        ids = httpx.post(base + "/tokenize", json={"prompt": prompt}).json()["tokens"]
        r = httpx.post(base + "/v1/completions/render", json={"prompt": prompt, "max_tokens": 3})
        assert r.status_code == 200 and r.json()[0]["token_ids"] == ids
        messages = [{"role": "user", "content": prompt}]
        chat = httpx.post(base + "/v1/chat/completions/render", json={"messages": messages}).json()
        assert chat["token_ids"] == httpx.post(base + "/tokenize", json={"messages": messages}).json()["tokens"]


def test_prompt_too_long_is_400_with_vllms_message(keyed):
    r = keyed.post("/v1/completions", json={"prompt": words(2040, "long"), "max_tokens": 16})
    assert r.status_code == 400
    msg = r.json()["error"]["message"]
    assert "maximum context length is 2048 tokens" in msg and "2056 tokens" in msg
    # the same prompt with room for its output is served
    assert keyed.post("/v1/completions", json={"prompt": words(2040, "long"), "max_tokens": 8}
                      ).status_code == 200


def test_wrong_or_missing_key_is_401_and_unknown_model_404(keyed):
    url = str(keyed.base_url) + "/v1/completions"
    assert httpx.post(url, json={"prompt": "hi"}).status_code == 401
    r = httpx.post(url, json={"prompt": "hi"}, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
    r = keyed.post("/v1/completions", json={"model": "other", "prompt": "hi"})
    assert r.status_code == 404 and "does not exist" in r.json()["error"]["message"]


# --- metrics ------------------------------------------------------------------------------------------
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
          "vllm:cache_config_info")
COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions",
            "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success")
HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
              "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
              "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
              "vllm:iteration_tokens_total", "vllm:request_prompt_tokens", "vllm:request_generation_tokens")


def test_metrics_have_vllm_names_types_labels_and_move(keyed):
    before = metrics(keyed)
    types = before["__types__"]
    for names, kind in ((GAUGES, "gauge"), (COUNTERS, "counter"), (HISTOGRAMS, "histogram")):
        for name in names:
            assert types.get(name) == kind, (name, types.get(name))
    assert types["sim:step_lateness_seconds"] == "counter"  # the simulator's own health, not vLLM's
    labels = dict(next(iter(before["vllm:num_requests_running"])))
    assert labels == {"engine": "0", "model_name": NAME}
    info = dict(next(iter(before["vllm:cache_config_info"])))
    assert info["block_size"] == "16" and info["cache_dtype"] == "auto"
    assert info["enable_prefix_caching"] == "True" and info["gpu_memory_utilization"] == "0.92"
    assert int(info["num_gpu_blocks"]) > 0

    prompt = words(50, "metrics")
    keyed.post("/v1/completions", json={"prompt": prompt, "max_tokens": 10})
    after = metrics(keyed)

    def delta(name, **labels):
        return total(after, name, **labels) - total(before, name, **labels)

    assert delta("vllm:generation_tokens_total") == 10
    assert delta("vllm:prompt_tokens_total") == 50
    assert delta("vllm:request_success_total", finished_reason="length") == 1
    assert delta("vllm:prefix_cache_queries_total") == 50
    assert delta("vllm:time_to_first_token_seconds_count") == 1
    assert delta("vllm:inter_token_latency_seconds_count") == 9
    assert delta("vllm:e2e_request_latency_seconds_count") == 1
    assert delta("vllm:request_generation_tokens_sum") == 10
    assert delta("vllm:iteration_tokens_total_sum") == 50 + 9  # one prefill step, then 9 decode steps
    assert total(after, "vllm:num_requests_running") == 0
    assert delta("sim:engine_steps_total") == 10


def test_shared_system_prompt_hits_prefix_cache(keyed):
    system = words(300, "system prompt")
    before = metrics(keyed)
    for q in ("first question", "another question entirely"):
        r = keyed.post("/v1/chat/completions", json={
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
            "max_tokens": 2})
        assert r.status_code == 200
    after = metrics(keyed)
    hits = total(after, "vllm:prefix_cache_hits_total") - total(before, "vllm:prefix_cache_hits_total")
    # the second request reuses the whole-block part of the template + system prompt (>= 18 blocks)
    assert hits >= 18 * 16
    assert total(after, "vllm:prefix_cache_hits_total") > 0


# --- timing and aborts (time scale 2, idle between tests) ---------------------------------------------
def test_idle_ttft_is_simulated_prefill_times_time_scale(scaled):
    n = 1500
    cfg = resolve(get_gpu(GPU), get_model(MODEL), Knobs(max_model_len=2048, max_num_seqs=2))
    core = EngineCore(cfg)
    core.add(Seq(rid=0, arrival=0.0, prompt_len=n, output_len=1, hashes=[]))
    prefill, _ = core.step(0.0)
    expected = prefill * 2
    before = metrics(scaled)
    body = {"prompt": words(n, time.time()), "max_tokens": 1, "stream": True}
    ttft = None
    t0 = time.monotonic()
    with scaled.stream("POST", "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if ttft is None and line.startswith("data: {"):
                ttft = time.monotonic() - t0
    assert expected * 0.98 <= ttft <= expected * 1.1 + 0.05, (ttft, expected)
    after = metrics(scaled)
    server_ttft = (total(after, "vllm:time_to_first_token_seconds_sum")
                   - total(before, "vllm:time_to_first_token_seconds_sum"))
    # the server reports simulated GPU seconds, not wall seconds
    assert prefill <= server_ttft <= prefill * 1.05 + 0.02, (server_ttft, prefill)


def _wait_gauges(client, timeout=5.0, **want) -> dict:
    """Scrape until the `vllm:` gauges named in `want` (without prefix) all have the wanted values."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(client)
        if all(total(m, "vllm:" + k) == v for k, v in want.items()) or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


def test_client_disconnect_aborts_running_and_waiting_requests(scaled):
    """max_num_seqs is 2: two long streams run, a stream and a non-streamed request wait. A client that
    gives up takes its request out of the engine at once, whichever state it is in."""
    base = str(scaled.base_url)
    before = metrics(scaled)
    body = {"prompt": words(40, "abort"), "max_tokens": 1500, "stream": True}
    clients = [httpx.Client(base_url=base, timeout=60) for _ in range(3)]
    held = []  # open streams and their line iterators (dropping either would close the connection)

    def open_stream(client):
        cm = client.stream("POST", "/v1/completions", json=body)
        held.append(cm)
        held.append(cm.__enter__().iter_lines())
        return held[-1]

    def impatient() -> None:  # a non-streamed request whose client times out while it is queued
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(base + "/v1/completions", json={**body, "stream": False}, timeout=2.0)

    waiter = threading.Thread(target=impatient)
    try:
        for c in clients[:2]:
            assert next(open_stream(c)).startswith("data: {")  # it is running: it produced a token
        open_stream(clients[2])  # headers come back at once; no token while both slots are busy
        waiter.start()
        m = _wait_gauges(scaled, num_requests_waiting=2)
        assert total(m, "vllm:num_requests_running") == 2 and total(m, "vllm:num_requests_waiting") == 2
        assert total(m, "vllm:kv_cache_usage_perc") > 0
        waiter.join()
        m = _wait_gauges(scaled, num_requests_waiting=1)
        assert total(m, "vllm:num_requests_waiting") == 1 and total(m, "vllm:num_requests_running") == 2
    finally:
        for c in clients:
            c.close()  # drops the connections mid-stream
        if waiter.is_alive():
            waiter.join()
    m = _wait_gauges(scaled, num_requests_running=0, num_requests_waiting=0)
    assert total(m, "vllm:num_requests_running") == 0 and total(m, "vllm:num_requests_waiting") == 0
    assert total(m, "vllm:kv_cache_usage_perc") == 0
    aborted = total(m, "sim:aborted_requests_total") - total(before, "sim:aborted_requests_total")
    assert aborted == 4
    # as in vLLM, an abort is not a finished request
    assert total(m, "vllm:request_success_total") == total(before, "vllm:request_success_total")
    # the engine still serves after the aborts
    r = scaled.post("/v1/completions", json={"prompt": "still alive", "max_tokens": 3})
    assert r.json()["usage"]["completion_tokens"] == 3


def test_human_readable_token_counts():
    assert human_readable_int("8k") == 8000 and human_readable_int("8K") == 8192
    assert human_readable_int("25.6k") == 25600 and human_readable_int(" 2048 ") == 2048
    with pytest.raises(argparse.ArgumentTypeError):
        human_readable_int("1.5K")


# --- start-up -----------------------------------------------------------------------------------------
def _run(*args: str, port: int, module: str = "tuner.cli.serve_sim") -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", module, *args, "--gpu", GPU, "--model", MODEL, "--port", str(port)]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("flags, code, message", [
    (("--kv-cache-dtype", "fp9"), 2, "error: argument --kv-cache-dtype: invalid choice: 'fp9'"),
    (("--gpu-memory-utilization", "0.05"), 1, "ValueError: No available memory for the cache blocks"),
    (("--max-num-batched-tokens", "8k", "--gpu-memory-utilization", "0.99"), 1,
     "ValueError: Free memory on device"),
    (("--max-model-len", "32768", "--gpu-memory-utilization", "0.7"), 1,
     "To serve at least one request with the models's max seq len (32768)"),
])
def test_invalid_launch_exits_with_vllms_message_before_binding(flags, code, message):
    """The port is held by the test: a server that tried to bind would fail with a bind error instead."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        res = _run(*flags, port=port)
    assert res.returncode == code, res.stderr
    assert message in res.stderr
    assert "address already in use" not in (res.stdout + res.stderr).lower()


def test_a_healthy_launch_on_a_held_port_fails_to_bind():
    """Control for the test above: a valid configuration does try to bind, and says so."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        res = _run("--max-model-len", "4096", port=holder.getsockname()[1])
    assert res.returncode != 0
    assert "GPU KV cache size:" in res.stdout
    assert "address already in use" in (res.stdout + res.stderr).lower()


def test_tune_sim_serve_passes_flags_to_the_same_parser():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        res = _run("sim", "serve", "--kv-cache-dtype", "fp9", port=holder.getsockname()[1],
                   module="tuner.cli")
    assert res.returncode == 2
    assert "tune sim serve: error: argument --kv-cache-dtype: invalid choice" in res.stderr


def test_a_crashed_engine_loop_takes_the_server_down():
    """Fault injection in the child: a server whose engine died must exit (non-zero, with the error in
    its log), not keep answering /health while never producing a token."""
    port = free_port()
    code = ("import sys\nfrom tuner.sim import engine\n"
            "def boom(self, now, events=None):\n    raise RuntimeError('injected fault')\n"
            "engine.EngineCore.step = boom\nfrom tuner.cli.sim import main\n"
            f"sys.exit(main(['--gpu', '{GPU}', '--model', '{MODEL}', '--port', '{port}']))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
            assert time.monotonic() < deadline
        try:
            status = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "hi"},
                                timeout=20).status_code
        except httpx.HTTPError:
            status = None  # connection closed as the server went down
        assert status is None or status >= 500
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1
    assert "EngineCore encountered a fatal error" in out and "RuntimeError: injected fault" in out


def test_a_speculative_launch_streams_every_token_and_exports_vllms_spec_decode_counters():
    """`--speculative-config` as vLLM takes it, with the acceptance rate stated: tokens arrive several a
    step but every one is delivered, and the counters give the stated rate back as vLLM's dashboard
    reads them (mean acceptance length = 1 + accepted / drafts = 1 + a + a^2 + a^3)."""
    spec = '{"method": "ngram", "num_speculative_tokens": 3}'
    with sim_server("--max-model-len", "2048", "--speculative-config", spec,
                    "--spec-acceptance", "ngram=0.6") as (base, _):
        with httpx.Client(base_url=base, timeout=60) as c:
            for i in range(4):
                r = c.post("/v1/completions", json={"model": MODEL, "prompt": words(40, i), "max_tokens": 64,
                                                    "ignore_eos": True, "stream": False})
                assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 64, r.text
            r = c.post("/v1/completions", json={"model": MODEL, "prompt": words(40, 9), "max_tokens": 64,
                                                "ignore_eos": True, "stream": True})
            chunks = [json.loads(line[6:]) for line in r.text.splitlines()
                      if line.startswith("data: {") and '"choices"' in line]
            assert sum(1 for ch in chunks for c_ in ch["choices"] if c_.get("text")) == 64, r.text[:500]
            m = metrics(c)
    drafts = total(m, "vllm:spec_decode_num_drafts_total")
    accepted = total(m, "vllm:spec_decode_num_accepted_tokens_total")
    assert total(m, "vllm:spec_decode_num_draft_tokens_total") == 3 * drafts > 0
    assert 1 + accepted / drafts == pytest.approx(1 + 0.6 + 0.36 + 0.216, rel=0.05)
