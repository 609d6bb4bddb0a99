"""Sample vLLM's queue, KV and LoRA gauges through a load run.

Gauges say what the engine was bound by (batch cap: running pinned at max_num_seqs with a queue; KV: usage
at 1.0 with preemptions), but only as a time series, so they are sampled every `interval_s` during the run.

Two ways to run it, same samples: as an asyncio task inside the replay client's loop (`run`), where each
sample parses only the three gauge families so it never holds the loop long enough to make a send late, or
on a background thread (`start`/`stop`) for callers without an event loop.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx

from tuner.metrics.parse import (KV_USAGE, LORA_MAX, LORA_RUNNING, RUNNING, SAMPLED_FAMILIES, WAITING,
                                 WAITING_DEFERRED, Snapshot, lora_waiting_only, parse_metrics)
from tuner.metrics.window import GaugeSample, LoraSample


class GaugeSampler:
    """Collects `GaugeSample`s with `t` in seconds since `t0` (a `time.monotonic()` value), divided by
    `time_scale` so samples share the clock of a time-scaled load run's records."""

    def __init__(self, base_url: str, *, interval_s: float = 0.5, api_key: str | None = None,
                 t0: float | None = None, time_scale: float = 1.0, timeout_s: float = 5.0):
        self.url = base_url.rstrip("/") + "/metrics"
        self.interval_s = interval_s
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.t0 = time.monotonic() if t0 is None else t0
        self.time_scale = time_scale
        self.timeout_s = timeout_s
        self.samples: list[GaugeSample] = []
        #: the LoRA state at each sample, where the server serves adapters (`vllm:lora_requests_info`)
        self.lora_samples: list[LoraSample] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _record(self, t: float, text: str) -> None:
        snap: Snapshot = parse_metrics(text, only=SAMPLED_FAMILIES, t=t)
        rel = (t - self.t0) / self.time_scale
        self.samples.append(GaugeSample(t=rel, running=snap.gauge(RUNNING), waiting=snap.gauge(WAITING),
                                        kv_usage=snap.gauge(KV_USAGE)))
        g = snap.gauges
        if LORA_RUNNING in g:
            deferred = g.get(WAITING_DEFERRED)
            self.lora_samples.append(LoraSample(
                t=rel, running=int(g[LORA_RUNNING]), waiting=lora_waiting_only(snap.lora_adapters),
                max_lora=int(g.get(LORA_MAX, 0)), deferred=None if deferred is None else int(deferred)))

    def _next_tick(self, n: int) -> float:
        # Ticks on a fixed grid so a slow scrape does not drift the series.
        return self.t0 + n * self.interval_s

    async def run(self, client: httpx.AsyncClient) -> None:
        """Sample from `t0` until cancelled (the caller cancels the task when the load run ends)."""
        n = 0
        await asyncio.sleep(max(0.0, self.t0 - time.monotonic()))
        while True:
            t = time.monotonic()
            try:
                self._take(t, await client.get(self.url, headers=self.headers, timeout=self.timeout_s))
            except httpx.HTTPError:
                self.errors += 1
            n = max(n + 1, int((time.monotonic() - self.t0) / self.interval_s) + 1)
            await asyncio.sleep(max(0.0, self._next_tick(n) - time.monotonic()))

    def _take(self, t: float, r: httpx.Response) -> None:
        """One scrape's outcome, the same for the asyncio and the thread sampler."""
        if r.status_code < 400:
            self._record(t, r.text)
        else:
            self.errors += 1

    def start(self) -> "GaugeSampler":
        """Sample on a background thread until `stop()`."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._thread_main, name="gauge-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[GaugeSample]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 1)
            self._thread = None
        return self.samples

    def _thread_main(self) -> None:
        n = 0
        self._stop.wait(max(0.0, self.t0 - time.monotonic()))
        with httpx.Client(timeout=self.timeout_s) as client:
            while not self._stop.is_set():
                t = time.monotonic()
                try:
                    self._take(t, client.get(self.url, headers=self.headers))
                except httpx.HTTPError:
                    self.errors += 1
                n = max(n + 1, int((time.monotonic() - self.t0) / self.interval_s) + 1)
                self._stop.wait(max(0.0, self._next_tick(n) - time.monotonic()))
