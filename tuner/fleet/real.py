"""The fleet in real time: the real vLLM Router in front of N HTTP-simulator replicas (`tune sim serve`).

Every process starts and stops like the engines do (`tuner.engine.launcher`: its own process group, a
pidfile, a watchdog, SIGTERM then SIGKILL), so a run leaves nothing behind whatever ends it. The router is
the `vllm-router` binary of PyPI `vllm-router` (the project extra `fleet`), found at `$TUNER_VLLM_ROUTER`,
on PATH, or beside this interpreter. Our replay client sends the load to the router; every replica's
`/metrics` is read before and after (its share of the requests, its prefix-cache hits). A replica can be
stopped mid-run (the failure case): the router's health checks and retries take it out.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from tuner.engine import launcher
from tuner.engine.base import Engine, LaunchFailure
from tuner.engine.http import HTTPServer
from tuner.engine.sim_http import HOST, SimHTTPEngine
from tuner.errors import UserError
from tuner.fleet import policies
from tuner.knobs import Knobs
from tuner.metrics.prometheus import PrometheusSource
from tuner.metrics.scrape import scrape, window
from tuner.metrics.window import MetricsWindow
from tuner.replay.client import run_load_http
from tuner.replay.record import LoadRun
from tuner.workload.model import WorkloadRequest

ROUTER_ENV = "TUNER_VLLM_ROUTER"
SCALE_OUT_FLAG = policies.SCALE_OUT_FLAG


def router_binary(given: str | None = None) -> str:
    """The vLLM Router's executable, or a one-line error saying how to install it."""
    for cand in (given, os.environ.get(ROUTER_ENV), shutil.which("vllm-router"),
                 str(Path(sys.executable).parent / "vllm-router")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    raise UserError("the vLLM Router is not installed (pip install 'slo-tuner[fleet]', or set "
                    f"{ROUTER_ENV})", field="--router")


@dataclass
class RealFleet:
    replicas: list[HTTPServer]
    router: launcher.ManagedProcess | None
    router_url: str = ""
    stopped: list[int] = field(default_factory=list)
    router_metrics_url: str = ""

    def router_decisions(self) -> dict[str, float]:
        """The router's own count of its cache-aware decisions by outcome (`prefix_hit`, `prefix_miss`,
        `load_imbalance`, `missing_tokens`: no token ids, so no prefix match was tried), from its
        `vllm_router_prefix_routing_decisions_total`; empty for the other policies."""
        import httpx
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(self.router_metrics_url, timeout=10).text
        out: dict[str, float] = {}
        for fam in text_string_to_metric_families(text):
            for sample in fam.samples:
                if sample.name == "vllm_router_prefix_routing_decisions_total":
                    outcome = sample.labels.get("outcome", "")
                    out[outcome] = out.get(outcome, 0.0) + sample.value
        return out

    def stop(self) -> None:
        """Stop the router, then every replica (each its whole process group)."""
        if self.router is not None:
            self.router.stop(term_timeout_s=5.0)
        for s in self.replicas:
            s.stop()

    def __enter__(self) -> "RealFleet":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop_replica(self, i: int) -> None:
        self.stopped.append(i)
        self.replicas[i].stop()


def start_fleet(gpu: str, model: str, knobs: Knobs, replicas: int, policy: str, *, run_dir: str | Path,
                time_scale: float = 1.0, router: str | None = None, router_args: Sequence[str] = (),
                startup_timeout_s: float = 60.0, scale_out: bool = True) -> RealFleet:
    """N `tune sim serve` replicas with `knobs`, then the router over them with `policy` (see
    `start_engine_fleet`). `scale_out`: the replicas run with `--enable-scale-out`, as the router's
    cache_aware needs of vLLM 0.32 (`SCALE_OUT_FLAG`)."""
    policies.check_policy(policy)
    if replicas < 1:
        raise UserError(f"must be >= 1, got {replicas}", field="--replicas")
    router = router_binary(router)  # before anything is made
    engine = SimHTTPEngine(gpu, model, time_scale=time_scale, run_dir=Path(run_dir) / "replicas",
                           extra_args=[SCALE_OUT_FLAG] if scale_out else [])
    return start_engine_fleet(engine, knobs, replicas, policy, run_dir=run_dir, router=router,
                              router_args=router_args, startup_timeout_s=startup_timeout_s)


def start_engine_fleet(engine: Engine, knobs: Knobs, replicas: int, policy: str, *, run_dir: str | Path,
                       router: str | None = None, router_args: Sequence[str] = (),
                       startup_timeout_s: float = 60.0) -> RealFleet:
    """N launches of `engine` with `knobs` (the HTTP simulator, or `vllm serve`), then the router over
    them with `policy`. On any failure everything started so far is stopped before the error (a router
    that does not come up is a `UserError` naming its log's last line)."""
    policies.check_policy(policy)
    if replicas < 1:
        raise UserError(f"must be >= 1, got {replicas}", field="--replicas")
    binary = router_binary(router)
    run_dir = Path(run_dir)
    fleet = RealFleet(replicas=[], router=None)
    try:
        for _ in range(replicas):
            fleet.replicas.append(engine.launch(knobs))
        port, metrics_port = launcher.free_port(HOST), launcher.free_port(HOST)
        while metrics_port == port:
            metrics_port = launcher.free_port(HOST)
        argv = [binary, "--host", HOST, "--port", str(port), "--policy", policy, "--prometheus-host", HOST,
                "--prometheus-port", str(metrics_port), "--worker-urls", *(s.base_url for s in fleet.replicas),
                *router_args]
        try:
            fleet.router, _ = launcher.launch(argv, run_dir=run_dir / "router", port=port, host=HOST,
                                              startup_timeout_s=startup_timeout_s, health_path="/health",
                                              log_name="router.log", stop_timeout_s=5.0)
        except LaunchFailure as e:
            last = (e.message or "").strip().splitlines()[-1:] or ["no output"]
            raise UserError(f"the vLLM Router did not start: {last[0][:300]}", field="--router") from None
        fleet.router_url = f"http://{HOST}:{port}"
        fleet.router_metrics_url = f"http://{HOST}:{metrics_port}/metrics"
        return fleet
    except BaseException:
        fleet.stop()
        raise


@dataclass
class RealRun:
    run: LoadRun
    replica_metrics: list[MetricsWindow | None]   # None: the replica was stopped (no after-scrape)


def run_real(fleet: RealFleet, requests: Sequence[WorkloadRequest], send_times: Sequence[float], *,
             offered_rate: float, stop_replica_at: float | None = None, time_scale: float = 1.0,
             request_timeout_s: float = 60.0, prometheus: str | None = None,
             prometheus_margin_s: float = 3.0, sessions: Sequence[str | None] | None = None) -> RealRun:
    """Send the load through the router, stop replica 0 at `stop_replica_at` schedule seconds if asked,
    and read every replica's metrics over the run: by scraping each /metrics before and after, or, with
    `prometheus` (the URL of a Prometheus that scrapes the replicas, as a fleet's monitoring does), as
    that server's series per replica (`instance="host:port"`), waiting `prometheus_margin_s` for the
    scrape that saw the last requests end. A stopped replica's window is read too from Prometheus (its
    series end where it died); by scraping it has none. `sessions[i]`: request i's session id, sent as
    the `X-Session-ID` header the router hashes (`tuner.fleet.load.fleet_requests` gives the virtual
    fleet's, `key.session`)."""
    if prometheus is not None:
        return _run_prometheus(fleet, requests, send_times, offered_rate=offered_rate,
                               stop_replica_at=stop_replica_at, time_scale=time_scale,
                               request_timeout_s=request_timeout_s, url=prometheus, margin_s=prometheus_margin_s,
                               sessions=sessions)
    before = [scrape(s.base_url) for s in fleet.replicas]
    run = _send(fleet, requests, send_times, offered_rate=offered_rate, stop_replica_at=stop_replica_at,
                time_scale=time_scale, request_timeout_s=request_timeout_s, sessions=sessions)
    after: list[MetricsWindow | None] = []
    for i, s in enumerate(fleet.replicas):
        after.append(None if i in fleet.stopped else window(before[i], scrape(s.base_url)))
    return RealRun(run=run, replica_metrics=after)


def _send(fleet: RealFleet, requests: Sequence[WorkloadRequest], send_times: Sequence[float], *,
          offered_rate: float, stop_replica_at: float | None, time_scale: float, request_timeout_s: float,
          sessions: Sequence[str | None] | None = None):
    """The load through the router, with replica 0 stopped `stop_replica_at` (virtual) seconds in: the one
    send both metric sources (scraped windows, Prometheus) share."""
    timer = None
    if stop_replica_at is not None:
        timer = threading.Timer(stop_replica_at * time_scale, fleet.stop_replica, args=(0,))
        timer.daemon = True
        timer.start()
    try:
        return run_load_http(fleet.router_url, requests, send_times, offered_rate=offered_rate,
                             model=fleet.replicas[0].model, metrics=False, request_timeout_s=request_timeout_s,
                             sessions=sessions)
    finally:
        if timer is not None:
            timer.cancel()


def _run_prometheus(fleet: RealFleet, requests: Sequence[WorkloadRequest], send_times: Sequence[float], *,
                    offered_rate: float, stop_replica_at: float | None, time_scale: float,
                    request_timeout_s: float, url: str, margin_s: float,
                    sessions: Sequence[str | None] | None = None) -> RealRun:
    sources = [PrometheusSource(url, selector=f'instance="{HOST}:{s.process.port}"') for s in fleet.replicas]
    run = _send(fleet, requests, send_times, offered_rate=offered_rate, stop_replica_at=stop_replica_at,
                time_scale=time_scale, request_timeout_s=request_timeout_s, sessions=sessions)
    time.sleep(margin_s)
    # whole-second steps: Prometheus 2.x refuses a "0.5s" step (the source's default), "1s" parses
    return RealRun(run=run, replica_metrics=[src.window_for_run(run, step_s=1.0, margin_s=margin_s)
                                             for src in sources])


__all__ = ["RealFleet", "RealRun", "start_fleet", "start_engine_fleet", "run_real", "router_binary", "ROUTER_ENV", "SCALE_OUT_FLAG"]
