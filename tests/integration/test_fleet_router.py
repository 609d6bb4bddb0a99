"""The real vLLM Router in front of three HTTP-simulator replicas: the policy set per run, our client
sending the load through it, every replica's /metrics read, one replica stopped mid-run, and nothing left
running afterwards; a router that will not start is one error with everything stopped."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tuner.errors import UserError
from tuner.fleet.load import arrivals, draw
from tuner.fleet.real import router_binary, run_real, start_fleet
from tuner.knobs import Knobs
from tuner.metrics.window import REQUEST_SUCCESS
from tuner.workload.synth import synthesize

try:
    router_binary()
    MISSING = None
except UserError as e:  # the extra `fleet` is not installed (.ci/setup-router.sh installs it)
    MISSING = str(e)

pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"{MISSING}")


def live_children() -> list[int]:
    """This process's children that are still running (not zombies), after a moment to exit."""
    me = str(os.getpid())
    for _ in range(50):
        kids = []
        for d in Path("/proc").iterdir():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[1] == me and fields[0] != "Z":
                kids.append(int(d.name))
        if not kids:
            return []
        time.sleep(0.1)
    return kids


# ~39 s, the slow tier: the default run keeps the real router in front of simulator replicas with one
# stopped mid-run in tests/e2e/test_fleet_real_cli.py::test_the_verified_fleet_through_the_real_router
@pytest.mark.slow
def test_router_spreads_the_load_reads_every_replica_and_survives_a_stopped_one(tmp_path):
    wl = synthesize("chat", 100, seed=3)
    times = arrivals([(0.0, 5.0)], 8.0, seed=3)
    reqs = draw(wl, len(times), seed=3)
    with start_fleet("rtx4090", "qwen2.5-7b", Knobs(), 3, "round_robin", run_dir=tmp_path, time_scale=1.5) as fleet:
        assert fleet.router is not None and len(live_children()) >= 4
        real = run_real(fleet, reqs, times, offered_rate=5.0, time_scale=1.5, stop_replica_at=4.0)
    assert live_children() == []
    served = [m.counters.get(REQUEST_SUCCESS, 0.0) if m else None for m in real.replica_metrics]
    assert served[0] is None  # stopped mid-run: no second scrape
    assert all(x and x > 0 for x in served[1:])
    after = [r for r in real.run.records if r.scheduled_s > 6.0]
    assert after and sum(r.ok for r in after) >= 0.8 * len(after)  # the router routed around the stopped one
    assert sum(r.ok for r in real.run.records) >= 0.6 * len(real.run.records)


# ~25 s, the slow tier: the default run keeps the model's session rule (tests/unit/test_fleet.py's
# consistent_hash tests) and the real router's start and refusal checks below
@pytest.mark.slow
def test_consistent_hash_pins_each_session_sent_as_x_session_id_to_one_replica(tmp_path):
    """The replay client's `sessions` go out as X-Session-ID, the router's first hash key: two sessions
    reach at most two of three replicas, and each session's requests one replica."""
    wl = synthesize("chat", 100, seed=6)
    times = arrivals([(0.0, 4.0)], 5.0, seed=6)
    reqs = draw(wl, len(times), seed=6)
    sessions = [("alice", "bob")[i % 2] for i in range(len(times))]
    with start_fleet("rtx4090", "qwen2.5-7b", Knobs(), 3, "consistent_hash", run_dir=tmp_path) as fleet:
        real = run_real(fleet, reqs, times, offered_rate=4.0, sessions=sessions)
    served = [m.counters.get(REQUEST_SUCCESS, 0.0) for m in real.replica_metrics if m]
    assert sum(r.ok for r in real.run.records) == len(reqs) == sum(served)
    assert sum(x > 0 for x in served) <= 2
    assert all(x == 0 or x in (sessions.count("alice"), sessions.count("bob"), len(reqs)) for x in served)


def test_a_router_that_will_not_start_is_one_error_and_leaves_nothing(tmp_path):
    with pytest.raises(UserError, match="the vLLM Router did not start"):
        start_fleet("rtx4090", "qwen2.5-7b", Knobs(), 1, "cache_aware", run_dir=tmp_path,
                    router_args=["--no-such-flag"], startup_timeout_s=20)
    assert live_children() == []


def test_a_policy_the_router_lacks_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(UserError, match="unknown routing policy"):
        start_fleet("rtx4090", "qwen2.5-7b", Knobs(), 3, "least_request", run_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_fleet_metrics_read_from_a_prometheus_that_scrapes_the_replicas(tmp_path):
    """Issue 39 item 5: where a fleet keeps its metrics, a Prometheus scraping every replica, the fleet run
    reads each replica's window from it; its counts agree with what the client saw served."""
    import shutil
    import subprocess

    import httpx

    from tuner.engine.launcher import free_port

    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is not installed (apt-get install prometheus; .ci/setup-prometheus.sh)")
    wl = synthesize("chat", 100, seed=4)
    times = arrivals([(0.0, 4.0)], 6.0, seed=4)
    reqs = draw(wl, len(times), seed=4)
    with start_fleet("rtx4090", "qwen2.5-7b", Knobs(), 2, "round_robin", run_dir=tmp_path / "fleet") as fleet:
        targets = ", ".join(f'"127.0.0.1:{s.process.port}"' for s in fleet.replicas)
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text(f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: vllm\n"
                       f"    static_configs:\n      - targets: [{targets}]\n")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with (tmp_path / "prometheus.log").open("w") as log:
            prom = subprocess.Popen([binary, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                     f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + 60
            while True:  # ready, and both replicas scraped
                assert prom.poll() is None and time.monotonic() < deadline, "prometheus did not come up"
                try:
                    res = httpx.get(url + "/api/v1/query", params={"query": 'sum(up{job="vllm"})'},
                                    timeout=2).json()["data"]["result"]
                    if res and res[0]["value"][1] == "2":
                        break
                except (httpx.HTTPError, ValueError, KeyError):
                    pass
                time.sleep(0.3)
            time.sleep(1.5)  # a scrape before the run
            real = run_real(fleet, reqs, times, offered_rate=4.0, prometheus=url, prometheus_margin_s=2.5)
        finally:
            prom.terminate()
            prom.wait(timeout=10)
    ok = sum(r.ok for r in real.run.records)
    served = [m.counter(REQUEST_SUCCESS) for m in real.replica_metrics if m is not None]
    assert len(served) == 2 and all(x > 0 for x in served)
    assert ok <= sum(served) <= 1.5 * ok  # increase() extrapolates to the window's edges
    assert any(s.running >= 1 for m in real.replica_metrics if m for s in m.samples)
