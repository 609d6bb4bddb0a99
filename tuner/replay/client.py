"""Open-loop HTTP load against an OpenAI-compatible server (`vllm serve`, the HTTP simulator).

Open loop is the point: request i goes out at `send_times[i]` whatever happened to the others, because a
client that waits for earlier responses slows down exactly when the server does and hides the queue the
SLO is about. So every request is its own task, created shortly (`LEAD_S`) before its time, which renders
its prompt and then waits precisely (`schedule.sleep_until`) for its send time; nothing ever awaits an
earlier request. A safety cap on requests in flight turns excess requests into errors (`"in-flight cap"`,
with a warning on the run) instead of delaying the schedule.

Sessions, on request (`sessions=[...]`, one id or None per request): a request's id goes out as the
`X-Session-ID` header, the first key the vLLM Router's `consistent_hash` (and `cache_aware`'s session
affinity) reads, so a router in front pins a session to one replica; None sends no header.

Closed loop, on request (`max_concurrency=C`, `vllm bench serve --max-concurrency`): at most C requests
are in flight; a request whose send time has come waits for a free slot (first come, first served), so
the schedule still paces sends but never runs ahead of the server. With all send times 0 (rate inf) it
is a pure closed loop of C clients. `sent_s` is when it really left (after its wait), so TTFT and E2EL
exclude the wait on the client, as `bench serve` measures them; `sent_s - scheduled_s` is the wait.
Many published measurements use this; it hides the queue the SLO is about (REFERENCE.md section 1).

Clock and window rules (also in docs/measurement.md):

- All record times are seconds since the run's start on `time.monotonic()`.
- Time scale: a simulator that runs its virtual GPU k times slower than real (it says so as
  `sim_time_scale` in `/v1/models` data[0]) gets the schedule stretched by k (request i is sent at
  `k * send_times[i]` real seconds) and every measured time divided by k, as are the request and stall
  timeouts, which are given in the server's time. Records then read as if the GPU ran at full speed.
  `scheduled_s` keeps the unscaled schedule.
- Measured window: requests scheduled before `warmup_s` or after `last_send - cooldown_s` get
  `in_window=False`; they are still sent (they keep the server in steady state) but a scorer skips them.
  `window_start_s`/`window_end_s` on the run are those two bounds.
- Ctrl-C or task cancellation stops the run cleanly: requests not finished are marked `"cancelled"`,
  the partial run is kept (`interrupted=True`) and `run_load_http` returns it.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import time
from typing import Callable, Literal, Sequence

import aiohttp
import httpx

from tuner.metrics.parse import Snapshot
from tuner.metrics.sampler import GaugeSampler
from tuner.metrics.scrape import ascrape, window
from tuner.metrics.window import MetricsWindow
from tuner.replay.record import CUT, NOT_SENT, LoadRun, RequestRecord
from tuner.replay.schedule import sleep_until
from tuner.replay.sse import stream_request_aiohttp
from tuner.workload.model import WorkloadRequest
from tuner.workload.prompts import render_messages, render_prompt

Api = Literal["completions", "chat"]
Progress = Callable[[int, int, int], None]
#: `stop_when(records, now)`, called every `stop_when.check_interval_s` (default 0.25) run seconds with
#: the live records: None goes on; "drain" stops sending and lets the requests in flight finish; "cut"
#: also cancels them (error "cut at decision", never good). Requests not yet sent get error "not sent"
#: and leave the measured window. The run's `stopped_s` says when.
StopWhen = Callable[[Sequence[RequestRecord], float], "str | None"]

#: A request's task is created this long before its send time, to render its prompt off the deadline.
LEAD_S = 0.05
#: Time between the run's setup and the first scheduled send.
START_DELAY_S = 0.1
CAP_ERROR = "in-flight cap"
CANCELLED = "cancelled"
#: The header a request's session id travels in (the vLLM Router's first session key, `hash_key.rs`).
SESSION_HEADER = "X-Session-ID"


class _Runner:
    """State of one load run; `run()` is the whole run, `result` survives cancellation."""

    def __init__(self, base_url: str, requests: Sequence[WorkloadRequest], send_times: Sequence[float], *,
                 offered_rate: float, model: str | None, api: Api, api_key: str | None,
                 request_timeout_s: float, stall_timeout_s: float, max_in_flight: int, warmup_s: float,
                 cooldown_s: float, metrics: bool, sample_interval_s: float, progress: Progress | None,
                 prompt_salt: int | str | None, engine: str, stop_when: StopWhen | None = None,
                 max_concurrency: int | None = None, sessions: Sequence[str | None] | None = None):
        if len(requests) != len(send_times):
            raise ValueError(f"{len(requests)} requests but {len(send_times)} send times")
        if sessions is not None and len(sessions) != len(requests):
            raise ValueError(f"{len(requests)} requests but {len(sessions)} session ids")
        self.sessions = list(sessions) if sessions is not None else None
        if not all(0.0 <= float(t) < float("inf") for t in send_times):
            raise ValueError("send times must be finite and >= 0")
        if api not in ("completions", "chat"):
            raise ValueError(f"api must be 'completions' or 'chat', not {api!r}")
        if max_concurrency is not None and (isinstance(max_concurrency, bool) or max_concurrency < 1):
            raise ValueError(f"max_concurrency must be an integer >= 1 or None, not {max_concurrency!r}")
        self.max_concurrency = max_concurrency
        #: Made inside the run's event loop (an asyncio primitive belongs to one loop).
        self._slots: asyncio.Semaphore | None = None
        #: Most requests in flight at once, as the client counted them.
        self.peak_in_flight = 0
        self.base = base_url.rstrip("/")
        self.requests, self.send_times = list(requests), [float(t) for t in send_times]
        self.offered_rate, self.model, self.api = offered_rate, model, api
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.api_key = api_key
        self.request_timeout_s, self.stall_timeout_s = request_timeout_s, stall_timeout_s
        self.max_in_flight, self.warmup_s, self.cooldown_s = max_in_flight, warmup_s, cooldown_s
        self.metrics, self.sample_interval_s, self.progress = metrics, sample_interval_s, progress
        self.salt = prompt_salt if prompt_salt is not None else random.getrandbits(32)
        self.engine = engine
        self.stop_when = stop_when
        self.stop_action: str | None = None
        self.stopped_s: float | None = None
        self.scale = 1.0
        self.t0 = 0.0
        self._sched0: tuple[float, float] | None = None
        self.in_flight = self.sent = self.done = self.good = self.cap_hits = 0
        self.warnings: list[str] = []
        span = max(self.send_times, default=0.0)
        self.window = (warmup_s, span - cooldown_s)
        self.records = [RequestRecord(index=i, scheduled_s=t, expected_output_tokens=r.output_tokens,
                                      prompt_tokens=r.prompt_tokens,
                                      in_window=self.window[0] <= t <= self.window[1])
                        for i, (r, t) in enumerate(zip(self.requests, self.send_times))]
        if self.records and not any(r.in_window for r in self.records):
            self.warnings.append(f"measured window is empty: warmup {warmup_s}s + cooldown {cooldown_s}s "
                                 f"cover the whole {span:.3g}s schedule")
        self.result: LoadRun | None = None

    def clock(self, mono: float) -> float:
        return (mono - self.t0) / self.scale

    # --- one request ---------------------------------------------------------------------------------
    def _body(self, i: int) -> bytes:
        req = self.requests[i]
        n = req.output_tokens
        # a request served by a LoRA adapter names it as the model (vLLM's `--lora-modules` name)
        body: dict = {"model": req.lora or self.model, "max_tokens": n, "min_tokens": n, "ignore_eos": True,
                      "stream": True, "stream_options": {"include_usage": True}}
        if self.api == "chat":
            body["messages"] = render_messages(req, i, salt=self.salt)
        else:
            body["prompt"] = render_prompt(req, i, salt=self.salt)
        return json.dumps(body).encode()

    async def _one(self, session, url: str, i: int, deadline: float) -> None:
        rec = self.records[i]
        body = self._body(i)
        sid = self.sessions[i] if self.sessions is not None else None
        headers = self.headers if sid is None else {**self.headers, SESSION_HEADER: sid}
        await sleep_until(deadline)
        if self._slots is None:
            await self._send(session, url, body, rec, headers)
            return
        async with self._slots:  # closed loop: wait for one of the C slots
            await self._send(session, url, body, rec, headers)

    async def _send(self, session, url: str, body: bytes, rec: RequestRecord, headers: dict) -> None:
        self.sent += 1
        if self.in_flight >= self.max_in_flight:
            rec.sent_s = self.clock(time.monotonic())
            rec.error = CAP_ERROR
            rec.end_s = rec.sent_s
            self.cap_hits += 1
            self.done += 1
            return
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            await stream_request_aiohttp(session, url, body, headers, rec, self.clock,
                                         request_timeout_s=self.request_timeout_s * self.scale,
                                         stall_timeout_s=self.stall_timeout_s * self.scale)
        except Exception as e:  # one odd request must not end the run; it is simply not good
            rec.error = f"client error: {e!r}"
        finally:
            self.in_flight -= 1
            self.done += 1
            if rec.ok:
                self.good += 1

    # --- the run -------------------------------------------------------------------------------------
    async def _discover(self, client: httpx.AsyncClient) -> None:
        """Model name and time scale from `/v1/models` (also a readiness check before the clock starts)."""
        try:
            r = await client.get(self.base + "/v1/models", headers=self.headers, timeout=30)
            r.raise_for_status()
            card = (r.json().get("data") or [{}])[0]
        except (httpx.HTTPError, ValueError) as e:
            if self.model is None:
                raise RuntimeError(f"cannot read {self.base}/v1/models to find the model name: {e}") from e
            self.warnings.append(f"/v1/models unreadable ({e}); assuming time scale 1")
            return
        if self.model is None:
            self.model = card.get("id")
        scale = card.get("sim_time_scale")
        if scale is not None:
            self.scale = float(scale)
            if self.scale <= 0:
                raise RuntimeError(f"server reports sim_time_scale={scale}, must be > 0")

    async def _scrape(self, client: httpx.AsyncClient) -> Snapshot | None:
        try:
            return await ascrape(client, self.base, self.api_key, timeout_s=30)
        except (httpx.HTTPError, ValueError) as e:
            self.warnings.append(f"/metrics scrape failed: {e}")
            return None

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            self._report()

    async def _stopper(self, tasks: list[asyncio.Task]) -> None:
        """Judge the run every check interval; on a decision stop sending (and, for "cut", cancel)."""
        assert self.stop_when is not None
        every = float(getattr(self.stop_when, "check_interval_s", 0.25)) * self.scale
        while self.stop_action is None:
            await asyncio.sleep(every)
            now = self.clock(time.monotonic())
            try:
                action = self.stop_when(self.records, now)
            except Exception as e:  # a broken rule must not end a measurement: run the schedule out
                self.warnings.append(f"stop rule failed and was dropped: {e!r}")
                return
            if action is None:
                continue
            self.stop_action, self.stopped_s = action, now
            self._stopped.set()
            for t, rec in zip(tasks, self._task_recs):
                if rec.sent_s is None or (action == "cut" and rec.end_s is None):
                    t.cancel()

    def _mark_stopped(self) -> None:
        for rec in self.records:
            if rec.sent_s is None:
                rec.error, rec.in_window = NOT_SENT, False
            elif rec.end_s is None and rec.error is None and rec.finish_s is None:
                rec.error = CUT  # stays in the window: never good (the verdict counted it so)
                rec.end_s = self.stopped_s
            elif self.stopped_s is not None and rec.sent_s > self.stopped_s:
                rec.in_window = False

    def _report(self) -> None:
        if self.progress is not None:
            try:
                self.progress(self.sent, self.done, self.good)
            except Exception as e:  # a broken progress bar must not end a measurement
                self.warnings.append(f"progress callback failed and was dropped: {e!r}")
                self.progress = None

    async def run(self) -> LoadRun:
        url = self.base + ("/v1/chat/completions" if self.api == "chat" else "/v1/completions")
        tasks: list[asyncio.Task] = []
        helpers: list[asyncio.Task] = []
        before: Snapshot | None = None
        sampler: GaugeSampler | None = None
        started_unix = time.time()
        # control calls (models, metrics) on httpx; the load on aiohttp, whose streamed request costs the
        # client about half httpx's CPU (the server pays for the client's CPU on a small host: RESULTS.md)
        async with httpx.AsyncClient(timeout=30.0) as client, aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None), auto_decompress=False) as session:
            try:
                await self._discover(client)
                if self.metrics:
                    before = await self._scrape(client)
                # Everything alive now lives through the run: keep the collector from re-scanning it, so
                # collections during the run stay short (a full one over a big heap can take tens of ms
                # and would show up as send lateness).
                gc.collect()
                gc.freeze()
                if self.max_concurrency is not None:
                    self._slots = asyncio.Semaphore(self.max_concurrency)
                self.t0 = time.monotonic() + START_DELAY_S
                self._sched0 = _thread_schedstat()
                started_unix = time.time() + START_DELAY_S
                if before is not None and self.sample_interval_s > 0:
                    sampler = GaugeSampler(self.base, interval_s=self.sample_interval_s,
                                           api_key=self.api_key, t0=self.t0, time_scale=self.scale)
                    helpers.append(asyncio.create_task(sampler.run(client)))
                helpers.append(asyncio.create_task(self._ticker()))
                self._task_recs: list[RequestRecord] = []
                self._stopped = asyncio.Event()
                if self.stop_when is not None:
                    helpers.append(asyncio.create_task(self._stopper(tasks)))
                order = sorted(range(len(self.records)), key=self.send_times.__getitem__)
                for i in order:
                    deadline = self.t0 + self.send_times[i] * self.scale
                    create_at = deadline - LEAD_S
                    if create_at > time.monotonic():
                        try:  # wakes early when the stop rule decides
                            await asyncio.wait_for(self._stopped.wait(), create_at - time.monotonic())
                        except TimeoutError:
                            pass
                    if self.stop_action is not None:
                        break
                    tasks.append(asyncio.create_task(self._one(session, url, i, deadline)))
                    self._task_recs.append(self.records[i])
                if tasks:  # a task the stop rule cancelled ends in CancelledError: returned, not raised
                    await asyncio.gather(*tasks, return_exceptions=True)
                if self.stop_action is not None:
                    self._mark_stopped()
                end = time.monotonic()
                for h in helpers:
                    h.cancel()
                await asyncio.gather(*helpers, return_exceptions=True)
                after = await self._scrape(client) if before is not None else None
                mw = window(before, after, sampler.samples if sampler else [],
                            sampler.lora_samples if sampler else []) if before and after else None
                self.result = self._finish(end, mw, started_unix)
                return self.result
            except asyncio.CancelledError:
                for t in tasks + helpers:
                    t.cancel()
                await asyncio.gather(*tasks, *helpers, return_exceptions=True)
                for rec in self.records:
                    if rec.error is None and rec.finish_s is None:
                        rec.error = CANCELLED
                self.warnings.append("interrupted: the run was cancelled before it finished")
                mw = MetricsWindow(samples=sampler.samples, lora_samples=sampler.lora_samples) if sampler else None
                self.result = self._finish(time.monotonic(), mw, started_unix, interrupted=True)
                raise
            finally:
                gc.unfreeze()

    def _finish(self, end: float, mw: MetricsWindow | None, started_unix: float,
                interrupted: bool = False) -> LoadRun:
        self._report()
        sched0, sched1 = self._sched0, _thread_schedstat()
        cpu_s = runq_s = None
        if sched0 is not None and sched1 is not None:
            cpu_s, runq_s = sched1[0] - sched0[0], sched1[1] - sched0[1]
        if self.cap_hits:
            self.warnings.append(f"{self.cap_hits} requests hit the in-flight cap ({self.max_in_flight}) "
                                 "and were recorded as errors; the server is far past saturation")
        short = sum(1 for r in self.records if r.ok and r.output_tokens < r.expected_output_tokens)
        if short:
            self.warnings.append(f"{short} requests returned fewer tokens than requested; the server may "
                                 "ignore min_tokens/ignore_eos or cap the length")
        return LoadRun(offered_rate=self.offered_rate, duration_s=max(0.0, self.clock(end)),
                       window_start_s=self.window[0], window_end_s=self.window[1], records=self.records,
                       metrics=mw, warnings=self.warnings, engine=self.engine, time_scale=self.scale,
                       interrupted=interrupted, started_unix=started_unix, stopped_s=self.stopped_s,
                       client_cpu_s=cpu_s, client_runq_s=runq_s, wall_clock=True)


async def run_load_async(base_url: str, requests: Sequence[WorkloadRequest], send_times: Sequence[float],
                         **kw) -> LoadRun:
    """`run_load_http` for callers already inside an event loop; cancellation propagates after the
    partial run is built (it is lost to the caller then; use `run_load_http` to keep it)."""
    return await _Runner(base_url, requests, send_times, **_defaults(kw)).run()


def _thread_schedstat() -> tuple[float, float] | None:
    """(seconds on a CPU, seconds runnable but waiting for one) of the calling thread, from Linux's
    schedstat; None elsewhere. The event loop's thread is the client: its run-queue wait is the time the
    host did not give the client, which no latency figure of its own can tell apart from the server's."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            cpu_ns, wait_ns = f.read().split()[:2]
        return int(cpu_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return None


def _defaults(kw: dict) -> dict:
    out = dict(offered_rate=0.0, model=None, api="completions", api_key=None, request_timeout_s=120.0,
               stall_timeout_s=30.0, max_in_flight=2048, warmup_s=0.0, cooldown_s=0.0, metrics=True,
               sample_interval_s=0.5, progress=None, prompt_salt=None, engine="http", stop_when=None,
               max_concurrency=None, sessions=None)
    unknown = set(kw) - set(out)
    if unknown:
        raise TypeError(f"unknown options: {sorted(unknown)}")
    out.update(kw)
    return out


def run_load_http(base_url: str, requests: Sequence[WorkloadRequest], send_times: Sequence[float], *,
                  offered_rate: float, model: str | None = None, api: Api = "completions",
                  api_key: str | None = None, request_timeout_s: float = 120, stall_timeout_s: float = 30,
                  max_in_flight: int = 2048, warmup_s: float = 0, cooldown_s: float = 0,
                  metrics: bool = True, sample_interval_s: float = 0.5, progress: Progress | None = None,
                  prompt_salt: int | str | None = None, engine: str = "http",
                  stop_when: StopWhen | None = None, max_concurrency: int | None = None,
                  sessions: Sequence[str | None] | None = None) -> LoadRun:
    """Send `requests[i]` at `send_times[i]` seconds (open loop) to `base_url` and measure every one.

    `model=None` takes the first model of `/v1/models` (a request whose `lora` is set is sent with its
    adapter as the model, the base model otherwise). `prompt_salt` seeds the request-unique part of
    synthesised prompts; the default is fresh per run so a second run on the same server does not hit the
    first run's prefix cache. With `metrics`, `/metrics` is scraped before and after (counter and
    histogram deltas) and its gauges sampled every `sample_interval_s` (0: not sampled). `progress(sent, done, ok)` is
    called about every 0.2 s. On Ctrl-C the partial run is returned with `interrupted=True`.
    `max_concurrency=C` makes it a closed loop of at most C requests in flight (see the module docstring).
    `sessions[i]`: request i's session id, sent as `X-Session-ID` (None: no header).
    """
    runner = _Runner(base_url, requests, send_times, **_defaults(dict(
        offered_rate=offered_rate, model=model, api=api, api_key=api_key,
        request_timeout_s=request_timeout_s, stall_timeout_s=stall_timeout_s, max_in_flight=max_in_flight,
        warmup_s=warmup_s, cooldown_s=cooldown_s, metrics=metrics, sample_interval_s=sample_interval_s,
        progress=progress, prompt_salt=prompt_salt, engine=engine, stop_when=stop_when,
        max_concurrency=max_concurrency, sessions=sessions)))
    try:
        return asyncio.run(runner.run())
    except (KeyboardInterrupt, asyncio.CancelledError):
        if runner.result is None:
            raise
        # the interrupt may land after the run was built as finished: it is still an interrupted run,
        # or the caller would carry on as if no Ctrl-C had come
        runner.result.interrupted = True
        return runner.result
