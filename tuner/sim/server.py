"""The HTTP simulator: vLLM's OpenAI server in front of the simulated engine core, on the wall clock.

Why it exists: the tuner's real-vLLM path (launch a subprocess, wait for `/health`, replay load over HTTP,
scrape `/metrics`, stop the process group) must be testable without a GPU. This server is that subprocess.
It schedules with the same `EngineCore` as the in-process engine (`tuner.engine.sim`), so the two cannot
disagree about scheduling; only the clock differs.

Clock: one asyncio task (`EngineLoop.run`) drives `EngineCore.step`. A step the model says takes `dur`
seconds of GPU time is waited out for `dur * time_scale` wall seconds, measured from absolute deadlines
(the next step starts at the previous deadline, not at whenever the event loop woke), so scheduling
jitter does not accumulate. `time_scale` K > 1 runs the simulated GPU K times slower than a real one, so a
small CPU can deliver every token on time; clients read K from `/v1/models` and divide their timings by it
(`tuner.replay.client`). Everything the server reports (`/metrics` histograms) is in simulated GPU time:
the engine core runs on the simulated clock `(wall - t0) / K` directly.

Requests are added to the core as they arrive and admitted at the next step (vLLM's behaviour); a client
that disconnects is aborted (`EngineCore.abort`), so its KV blocks go back to the pool at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
import time
from typing import Awaitable, Callable, Sequence

from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tuner.sim.config import ResolvedConfig
from tuner.sim.costs import CostParams
from tuner.sim.engine import EngineCore, Seq
from tuner.sim.protocol import (UNAUTHORIZED, BadRequest, Renderer, WatchedStream, parse_request,
                                sse_body, wait_done_or_gone)
from tuner.sim.quality import DEFAULT_MAX_LOGPROBS, StandIn, logit_noise, truncate
from tuner.sim.responses import responses_endpoint
from tuner.sim.tokenize import render_routes, tokenize_endpoint
from tuner.tokens import TokenCounter, block_hashes
from tuner.sim.exporter import SimMetrics

#: When the event loop falls further behind the simulated GPU than this (wall seconds), the simulated
#: clock gives up catching up: the host, not the modelled GPU, is the bottleneck, and latencies show it.
MAX_LAG_S = 0.25

#: a route's handler, as Starlette calls it
Endpoint = Callable[[Request], Awaitable[Response]]


class SimRequest:
    """What a handler waits on: tokens delivered so far, and whether the request is over. `event` is set
    per token for a stream, only at the end otherwise (a non-streamed handler has nothing to do before)."""

    __slots__ = ("seq", "stream", "tokens", "done", "aborted", "event", "last_token")

    def __init__(self, seq: Seq, stream: bool = True):
        self.seq = seq
        self.stream = stream
        self.tokens = 0
        self.done = False
        self.aborted = False
        self.event = asyncio.Event()
        self.last_token: float | None = None


class EngineLoop:
    """Drives the engine core on the wall clock and hands each request its tokens."""

    def __init__(self, cfg: ResolvedConfig, *, time_scale: float = 1.0, noise: float = 0.0, seed: int = 0,
                 model_name: str = "model", cost_params: CostParams | None = None):
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.cfg = cfg
        self.k = float(time_scale)
        self.core = EngineCore(cfg, cost_params, noise=noise, seed=seed, keep_step_times=False)
        self.metrics = SimMetrics(cfg, self.core, model_name)
        self.t0 = time.monotonic()
        self._rid = itertools.count()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.crashed: BaseException | None = None
        #: Called once if the loop dies (the server shuts itself down and exits 1).
        self.on_crash: Callable[[], None] | None = None

    def sim_now(self) -> float:
        """Seconds on the simulated GPU's clock."""
        return (time.monotonic() - self.t0) / self.k

    # -- requests -------------------------------------------------------------------------------
    def check(self, prompt_len: int, max_tokens: int) -> str | None:
        return self.core.check(prompt_len, max_tokens)

    def submit(self, prompt_ids: Sequence[int], max_tokens: int, stream: bool = True, lora: int = -1) -> SimRequest:
        """Queue a request in the engine (`lora`: its adapter's index, -1 the base model); it is admitted
        at the next step."""
        seq = Seq(rid=next(self._rid), arrival=self.sim_now(), prompt_len=len(prompt_ids),
                  output_len=max_tokens, hashes=block_hashes(prompt_ids, self.cfg.block_size)
                  if self.cfg.enable_prefix_caching else [], lora=lora)
        req = SimRequest(seq, stream)
        seq.payload = req
        self.core.add(seq)
        if self._wake is not None:
            self._wake.set()
        return req

    def abort(self, req: SimRequest) -> None:
        """The client left: take the request out of the engine (no-op once it has finished)."""
        if req.done or req.aborted:
            return
        req.aborted = True
        if self.core.abort(req.seq):
            self.metrics.aborted += 1

    # -- the loop -------------------------------------------------------------------------------
    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self.run(), name="sim-engine-loop")
        self._task.add_done_callback(self._died)

    def _died(self, task: asyncio.Task) -> None:
        """An engine loop that crashed must take the server down, as a dead vLLM engine core does:
        a server that still answers /health but never produces a token would read as an overload."""
        if task.cancelled() or task.exception() is None:
            return
        import traceback

        exc = self.crashed = task.exception()
        print("ERROR [core.py] EngineCore encountered a fatal error.", file=sys.stderr)
        traceback.print_exception(exc, file=sys.stderr)
        sys.stderr.flush()
        if self.on_crash is not None:
            self.on_crash()

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():  # a crashed loop was reported by _died
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def run(self) -> None:
        core, k, t0, m = self.core, self.k, self.t0, self.metrics
        wake = self._wake if self._wake is not None else asyncio.Event()
        self._wake = wake
        deadline: float | None = None
        while True:
            if not core.has_work():
                wake.clear()
                await wake.wait()
                deadline = None  # idle: the GPU starts the next step when work arrives
                continue
            wall = time.monotonic()
            start = wall if deadline is None else max(deadline, wall - MAX_LAG_S)
            begin = (start - t0) / k
            events: list[Seq] = []
            dur, finished = core.step(begin, events)
            if core.last_step_tokens:
                m.iteration.observe(core.last_step_tokens)
            deadline = start + dur * k
            delay = deadline - time.monotonic()
            await asyncio.sleep(delay if delay > 0 else 0)
            m.steps += 1
            m.late_s += time.monotonic() - deadline
            self._deliver(begin + dur, events, finished)

    def _deliver(self, end: float, events: list[Seq], finished: list[Seq]) -> None:
        """Hand out the tokens of a step that ended at simulated time `end`; O(sequences in the step)."""
        m = self.metrics
        itl = m.itl
        for seq in events:
            req: SimRequest = seq.payload
            if req.aborted:
                continue
            req.tokens += 1
            if req.last_token is None:
                m.ttft.observe(end - seq.arrival)
            else:
                itl.observe(end - req.last_token)
            req.last_token = end
            if req.stream:
                req.event.set()
        for seq in finished:
            req = seq.payload
            if req.aborted:
                continue
            req.done = True
            req.event.set()
            scheduled = seq.first_scheduled if seq.first_scheduled is not None else seq.arrival
            first = seq.first_token if seq.first_token is not None else end
            m.e2e.observe(end - seq.arrival)
            m.queue.observe(max(0.0, scheduled - seq.arrival))
            m.inference.observe(max(0.0, end - scheduled))
            m.prefill.observe(max(0.0, first - scheduled))
            m.decode.observe(end - first)
            m.prompt_len.observe(seq.prompt_len)
            m.gen_len.observe(seq.output_len)


def build_app(loop: EngineLoop, *, served_names: Sequence[str], api_key: str | None = None,
              root: str | None = None, tokens: TokenCounter | None = None,
              max_logprobs: int = DEFAULT_MAX_LOGPROBS, scale_out: bool = False) -> Starlette:
    """The Starlette app: vLLM's endpoints over `loop`. `served_names[0]` labels the metrics; `tokens`
    counts prompts (default: the estimate); `max_logprobs`: vLLM's `--max-logprobs`; `scale_out`: vLLM's
    `--enable-scale-out` (the render endpoints answer, `tuner.sim.tokenize`)."""
    served = tuple(served_names)
    stand_in = StandIn(noise=logit_noise(loop.cfg.kv_cache_dtype, loop.cfg.quantization), max_logprobs=max_logprobs)
    cfg = loop.cfg
    # LoRA adapters answer to their names in `model` (vLLM's --lora-modules), beside the base model's
    lora = cfg.lora
    adapter_of = lora.index() if lora is not None else {}
    accepted = served + tuple(adapter_of)
    auth = f"Bearer {api_key}" if api_key else None

    def unauthorized(request: Request) -> JSONResponse | None:
        if auth is not None and request.headers.get("authorization") != auth:
            return JSONResponse(UNAUTHORIZED, status_code=401)
        return None

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def metrics(request: Request) -> Response:
        return Response(loop.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def models(request: Request) -> Response:
        denied = unauthorized(request)
        if denied:
            return denied
        return JSONResponse({"object": "list", "data": _model_cards(loop, served, root, adapter_of)})

    completions, chat_completions = _generate_endpoints(loop, accepted, adapter_of, unauthorized, stand_in, tokens)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        loop.start()
        try:
            yield
        finally:
            await loop.stop()

    return Starlette(routes=[
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/responses", responses_endpoint(loop, served, unauthorized, tokens=tokens), methods=["POST"]),
        Route("/tokenize", tokenize_endpoint(accepted, unauthorized, max_model_len=cfg.max_model_len, tokens=tokens),
              methods=["POST"]),
        *(Route(path, handler, methods=["POST"])
          for path, handler in render_routes(accepted, unauthorized, enabled=scale_out, tokens=tokens)),
    ], lifespan=lifespan)


def _model_cards(loop: EngineLoop, served: tuple[str, ...], root: str | None, adapter_of: dict[str, int]) -> list[dict]:
    """`/v1/models`' data: the served names, then each LoRA adapter with the base model as its parent."""
    cfg, lora = loop.cfg, loop.cfg.lora
    created = int(loop.metrics.started)
    data = [{"id": name, "object": "model", "created": created, "owned_by": "vllm",
             "root": root or name, "parent": None, "max_model_len": cfg.max_model_len,
             "sim_time_scale": loop.k, "sim_gpu": cfg.gpu.name} for name in served]
    data += [{"id": name, "object": "model", "created": created, "owned_by": "vllm",
              "root": (lora.paths[i] if lora is not None and i < len(lora.paths) else None) or name,
              "parent": served[0], "max_model_len": cfg.max_model_len, "sim_time_scale": loop.k,
              "sim_gpu": cfg.gpu.name} for name, i in adapter_of.items()]
    return data


def _generate_endpoints(loop: EngineLoop, accepted: tuple[str, ...], adapter_of: dict[str, int],
                        unauthorized: Callable[[Request], JSONResponse | None], stand_in: StandIn,
                        tokens: TokenCounter | None) -> tuple[Endpoint, Endpoint]:
    """The handlers of `/v1/completions` and `/v1/chat/completions`: the request checked as vLLM checks
    it, submitted to `loop`, then streamed or answered whole."""

    async def generate(request: Request, chat: bool) -> Response:
        denied = unauthorized(request)
        if denied:
            return denied
        raw = await request.body()
        body: dict | None = None
        try:
            p = parse_request(raw, chat=chat, served=accepted, tokens=tokens)
            if not chat and not p.stream:  # the quality check's fields (`tuner.sim.quality`)
                body = json.loads(raw)
                p.prompt_ids = truncate(body, p.prompt_ids)
                refused = stand_in.refusal(body)
                if refused:
                    raise BadRequest(refused, param="prompt_logprobs")
            err = loop.check(len(p.prompt_ids), p.max_tokens)
            if err:
                raise BadRequest(err)
        except BadRequest as e:
            return JSONResponse(e.body(), status_code=e.status)
        req = loop.submit(p.prompt_ids, p.max_tokens, p.stream, adapter_of.get(p.model, -1))
        out = Renderer(chat, p.model)
        if p.stream:
            return WatchedStream(sse_body(loop, req, p, out), media_type="text/event-stream")
        if not await wait_done_or_gone(req, request.receive):
            loop.abort(req)
            return Response(status_code=499)
        full = out.full(len(p.prompt_ids), p.max_tokens)
        if body:
            full["choices"][0].update(stand_in.extra_fields(body, p.prompt_ids, p.max_tokens))
        return JSONResponse(full)

    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    return completions, chat_completions


def run_server(cfg: ResolvedConfig, *, host: str, port: int, served_names: Sequence[str],
               api_key: str | None = None, time_scale: float = 1.0, noise: float = 0.0, seed: int = 0,
               root: str | None = None, tokens: TokenCounter | None = None,
               cost_params: CostParams | None = None, max_logprobs: int = DEFAULT_MAX_LOGPROBS,
               scale_out: bool = False) -> int:
    """Serve until SIGINT/SIGTERM; the exit code (1 when the port could not be bound)."""
    import uvicorn

    loop = EngineLoop(cfg, time_scale=time_scale, noise=noise, seed=seed, model_name=served_names[0],
                      cost_params=cost_params)
    app = build_app(loop, served_names=served_names, api_key=api_key, root=root, tokens=tokens,
                    max_logprobs=max_logprobs, scale_out=scale_out)
    print(f"INFO [api_server.py] Starting simulated vLLM API server on http://{host}:{port} "
          f"({cfg.gpu.name}, {cfg.model.name}, time scale {time_scale:g})", flush=True)
    # access logs off: a line per request would cost more CPU than the simulation on a small machine;
    # a short graceful shutdown, so SIGTERM with streams still open ends in seconds, as the launcher expects
    config = uvicorn.Config(app, host=host, port=port, log_level="info", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=2, timeout_keep_alive=30)
    server = uvicorn.Server(config)
    loop.on_crash = lambda: setattr(server, "should_exit", True)
    server.run()
    return 0 if server.started and loop.crashed is None else 1
