"""A real Prometheus server scraping the test server during a load run, read back by `PrometheusSource`.

Needs the `prometheus` binary (Debian package `prometheus`; .ci/setup-prometheus.sh installs it); skips
with that reason otherwise. Slow: Prometheus must start and scrape before and after the run.
"""

import shutil
import socket
import subprocess
import time

import httpx
import pytest

from tests.helpers.openai_server import start_server
from tuner.metrics.parse import TTFT
from tuner.metrics.prometheus import PrometheusSource
from tuner.metrics.scrape import histogram_quantile
from tuner.metrics.window import GENERATION_TOKENS, PREEMPTIONS, REQUEST_SUCCESS
from tuner.replay.client import run_load_http
from tuner.workload.model import WorkloadRequest

pytestmark = pytest.mark.slow
SCRAPE_S = 1.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def prometheus(tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is not installed (apt-get install prometheus)")
    with start_server(ttft=0.02, tpot=0.01) as srv:
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text(f"""global:
  scrape_interval: {SCRAPE_S:g}s
  evaluation_interval: {SCRAPE_S:g}s
scrape_configs:
  - job_name: vllm
    static_configs:
      - targets: ["127.0.0.1:{srv.port}"]
""")
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        log = (tmp_path / "prometheus.log").open("w")
        proc = subprocess.Popen([binary, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + 60
            while True:  # ready, and the target scraped at least once
                assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "prometheus did not scrape the target in 60 s"
                try:
                    r = httpx.get(url + "/api/v1/query", params={"query": 'up{job="vllm"}'}, timeout=2)
                    res = r.json()["data"]["result"] if r.status_code == 200 else []
                    if res and res[0]["value"][1] == "1":
                        break
                except (httpx.HTTPError, ValueError, KeyError):
                    pass
                time.sleep(0.2)
            yield srv, url
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            log.close()


def test_prometheus_window_agrees_with_direct_scrapes(prometheus):
    srv, url = prometheus
    time.sleep(1.5 * SCRAPE_S)  # a scrape before the run
    n = 60
    reqs = [WorkloadRequest(prompt_tokens=20, output_tokens=40) for _ in range(n)]
    run = run_load_http(srv.base_url, reqs, [i * 0.05 for i in range(n)], offered_rate=20,
                        sample_interval_s=0.5)
    assert all(r.ok for r in run.records)
    time.sleep(2.5 * SCRAPE_S)  # scrapes after the run
    direct = run.metrics
    assert direct.counter(REQUEST_SUCCESS) == n

    src = PrometheusSource(url, selector='job="vllm"')
    start = run.started_unix - 1.2 * SCRAPE_S
    end = run.started_unix + run.duration_s + 2.2 * SCRAPE_S
    w = src.window(start, end, step_s=SCRAPE_S, t0_unix=run.started_unix)

    # increase() extrapolates to the window edges: at least the true count, at most ~a scrape more.
    assert n <= w.counter(REQUEST_SUCCESS) <= n * 1.4
    assert n * 40 <= w.counter(GENERATION_TOKENS) <= n * 40 * 1.4
    assert w.counter(PREEMPTIONS) == 0
    h = w.histograms[TTFT]
    assert n <= h.count <= n * 1.4
    assert 0.01 <= histogram_quantile(h, 0.5) <= 0.04  # the server's TTFT is 20 ms
    assert 0.01 <= histogram_quantile(direct.histograms[TTFT], 0.5) <= 0.04
    # Gauges: one sample per step across the window, the run's concurrency (~8) seen mid-run.
    assert len(w.samples) >= int(end - start) - 1
    assert w.samples[0].t < 0 < w.samples[-1].t
    assert max(s.running for s in w.samples) >= 2
    assert max(s.running for s in direct.samples) >= 2
    assert w.cache_config == {"block_size": "16", "enable_prefix_caching": "True"}
    assert w.cache_config == direct.cache_config
