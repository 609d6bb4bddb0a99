"""The in-process simulated engine: launches and load runs in virtual time.

Same `Engine`/`Server` contract as real `vllm serve`, so the tuner runs unchanged; a launch that vLLM
would refuse raises the same classified `LaunchFailure`, and a load run takes milliseconds. Requests are
turned into what the engine core needs (prompt length, chained block hashes) exactly as the HTTP
simulator would derive them from the completions prompt the replay client sends, with the same
`TokenCounter` (the model's tokenizer.json when `model` is a local folder, else the estimate).
"""

from __future__ import annotations

from typing import Callable, Sequence

from tuner.engine.base import Engine, LaunchFailure, LaunchInfo, Server
from tuner.engine.classify import launch_facts
from tuner.engine.simulated import SimulatedEngineChecks
from tuner.knobs import Knobs
from tuner.profiles.gpus import GPUProfile, get_gpu
from tuner.profiles.models import ModelProfile, get_model
from tuner.replay.record import CUT, NOT_SENT, LoadRun
from tuner.sim.config import ResolvedConfig, resolve
from tuner.lora.catalog import read_lora_dir
from tuner.sim.costs import CostParams
from tuner.sim.lora import LoraSetup
from tuner.sim.engine import EngineCore
from tuner.tokens import (RegexCounter, TokenCounter, block_hashes, block_hashes_from_ids,
                              token_counter_for)
from tuner.engine.virtual import SimRequest, gc_paused, merge_replicas, run_virtual
from tuner.workload.model import WorkloadRequest
from tuner.workload.prompts import request_text


def request_shape(req: WorkloadRequest, index: int, tokens: TokenCounter | None = None
                  ) -> tuple[int, list[int]]:
    """(prompt tokens, prompt block hashes) of a workload request, as the simulator sees it."""
    tokens = tokens or RegexCounter()
    text = request_text(req)
    if req.prefix_hash_ids is not None:
        n = req.prompt_tokens or tokens.count(text or "")
        return n, block_hashes_from_ids(req.prefix_hash_ids, req.hash_block_size, n, unique=index)
    if text is not None:
        ids = tokens.ids(text)
        return len(ids), block_hashes(ids)
    return req.prompt_tokens, []  # nothing shared: no hashes needed


class SimServer(Server):
    """One simulated `vllm serve`: `data_parallel_size` engine cores (one per replica) behind one API
    server. vLLM's DP load balancer sends each request to the least-loaded engine; here requests go to
    the replicas in turn by send time (round robin), which for the open-loop arrivals the tuner sends
    gives each replica the same share and is slightly pessimistic at the tails."""

    def __init__(self, cfg: ResolvedConfig, cost_params: CostParams | None, noise: float, seed: int,
                 token_times: bool = True, tokens: TokenCounter | None = None):
        self.cfg = cfg
        self.token_times = token_times
        self.tokens = tokens or RegexCounter()
        self.cores = [EngineCore(cfg, cost_params, noise=noise, seed=seed + 7919 * i, keep_step_times=True)
                      for i in range(cfg.data_parallel_size)]
        self.info = LaunchInfo(kv_cache_tokens=cfg.kv_cache_tokens, max_concurrency=cfg.max_concurrency)
        self.launch_log = f"{cfg.launch_log()}\nINFO simulator: token counts: {self.tokens.source}"
        self._shapes: dict[int, tuple[WorkloadRequest, int, list[int]]] = {}
        self._adapter = cfg.lora.index() if cfg.lora is not None else {}

    def _shape(self, req: WorkloadRequest, index: int) -> tuple[int, list[int]]:
        hit = self._shapes.get(id(req))
        if hit is None or hit[0] is not req:
            n, h = request_shape(req, index, self.tokens)
            hit = self._shapes[id(req)] = (req, n, h)
        return hit[1], hit[2]

    @gc_paused  # the request shapes and records too (`tuner.engine.virtual.gc_paused`)
    def run_load(self, requests: Sequence[WorkloadRequest], send_times: Sequence[float], *,
                 offered_rate: float, request_timeout_s: float = 120.0, warmup_s: float = 0.0,
                 cooldown_s: float = 0.0, token_times: bool | None = None,
                 prompt_salt: int | None = None, stop_when=None,
                 max_concurrency: int | None = None) -> LoadRun:
        sims = []
        if prompt_salt is not None:
            self._shapes.clear()
        for i, (req, t) in enumerate(zip(requests, send_times)):
            n, h = self._shape(req, i if prompt_salt is None else hash((prompt_salt, i)))
            sims.append(SimRequest(float(t), n, req.output_tokens, h, self._adapter.get(req.lora, -1)
                                   if req.lora is not None else -1))
        span = max(send_times, default=0.0)
        dp = len(self.cores)
        shares: list[list[int]] = [[]]  # one engine (the hot path of every simulated study): no split
        if dp > 1:
            order = sorted(range(len(sims)), key=lambda i: sims[i].arrival)
            shares = [order[k::dp] for k in range(dp)]
        runs = []
        for core, share in zip(self.cores, shares):
            # a fresh step clock per load run keeps memory bounded; the KV pool (prefix cache) carries over
            core.step_end.clear()
            core.step_idx = 0
            core.finish_at.clear()
            runs.append(run_virtual(self.cfg, [sims[i] for i in share] if dp > 1 else sims, engine=core,
                                    request_timeout_s=request_timeout_s,
                                    sample_interval_s=min(0.5, max(0.01, span / 150)),
                                    warmup_s=warmup_s, cooldown_s=cooldown_s,
                                    token_times=self.token_times if token_times is None else token_times,
                                    max_concurrency=max_concurrency and -(-max_concurrency // dp)))
            self._drain(core)
        records, metrics = (runs[0].records, runs[0].metrics) if dp == 1 else merge_replicas(runs, shares)
        out = LoadRun(offered_rate=offered_rate, duration_s=max(r.duration_s for r in runs), records=records,
                      metrics=metrics, engine="sim", window_start_s=warmup_s,
                      window_end_s=max(send_times, default=0.0) - cooldown_s)
        if stop_when is not None:
            replay_stop_rule(out, stop_when, span)
        return out

    @staticmethod
    def _drain(core: EngineCore) -> None:
        """Abort whatever a timed-out run left in the engine, as clients disconnecting would."""
        while core.running:
            core._preempt_tail(core.step_idx, scheduled_decodes=False)
        core.waiting.clear()
        core.prefilling.clear()

    def stop(self) -> None:
        self._shapes.clear()


def replay_stop_rule(run: LoadRun, stop_when, span: float, max_checks: int = 400) -> None:
    """Apply a load run's `stop_when` rule as the HTTP client would have, at its check times, to a run
    simulated whole: requests sent after the decision become "not sent" (out of the window), and after
    a "cut" those still in flight become "cut at decision" (never good); the run's duration ends at the decision (cut) or when the last
    request sent before it ended (drain). Virtual time is free, so the whole schedule is simulated first;
    the requests in flight at the decision then ran beside arrivals the real client would not have sent
    (slightly pessimistic latencies for them, at most one E2E latency's worth of the run)."""
    records = run.records
    table = stop_when.table(records) if hasattr(stop_when, "table") else None
    every = max(float(getattr(stop_when, "check_interval_s", 0.25)), span / max_checks)
    t = every
    action = None
    while t <= span + every:
        action = stop_when(table if table is not None else records, t)
        if action is not None:
            break
        t += every
    if action is None:
        return
    ends = []
    for r in records:
        if r.sent_s is None or r.sent_s > t:
            r.error, r.in_window, r.finish_s, r.first_token_s, r.token_times = NOT_SENT, False, None, None, None
            r.end_s = None
            continue
        if action == "cut" and (r.end_s is None or r.end_s > t):
            r.error, r.end_s = CUT, t
        ends.append(r.end_s if r.end_s is not None else t)
    run.stopped_s = t
    run.window_end_s = min(run.window_end_s, t)
    run.duration_s = t if action == "cut" else max(ends, default=t)


class SimEngine(SimulatedEngineChecks, Engine):
    """`--engine sim`: the simulator in this process, in virtual time."""

    name = "sim"
    virtual_time = True

    @classmethod
    def from_spec(cls, spec) -> "SimEngine":
        cls.needs_gpu_and_model(spec)
        stated = tuple(sorted(spec.spec_acceptance.items()))
        return cls(spec.gpu, spec.model, noise=spec.noise, seed=spec.seed, token_times=spec.token_times,
                   host_gpus=spec.host_gpus, cost_params=CostParams(spec_acceptance=stated) if stated else None,
                   adapters=read_lora_dir(spec.lora_dir).adapters if spec.lora_dir else None)

    def __init__(self, gpu: str | GPUProfile, model: str | ModelProfile, *,
                 cost_params: CostParams | None = None, noise: float = 0.0, seed: int = 0,
                 token_times: bool = True, launch_seed: Callable[[Knobs], int] | None = None,
                 other_used_gib: float | None = None, host_gpus: int | None = None, adapters=None):
        """`token_times=False` skips per-token times (only ITL needs them: a faster study when the SLO has
        no ITL threshold). `launch_seed` picks each launch's noise seed (default: one per launch).
        `other_used_gib`: GPU memory other processes hold (a busy GPU, where vLLM's default memory
        utilisation does not fit), as vLLM's start-up check sees it."""
        self.gpu = get_gpu(gpu) if isinstance(gpu, str) else gpu
        self.model = get_model(model) if isinstance(model, str) else model
        # a local model folder (or its config.json) brings its tokenizer.json; a profile name does not
        self.tokens = token_counter_for(model if isinstance(model, str) else None)
        self.cost_params = cost_params
        self.noise = noise
        self.seed = seed
        self.launches = 0
        self.token_times = token_times
        self.launch_seed = launch_seed
        self.other_used_gib = other_used_gib
        self.host_gpus = host_gpus
        # LoRA adapters (`tuner.lora.catalog.Adapter`s): served as `--enable-lora --lora-modules` would
        self.lora = LoraSetup.of(adapters, self.model) if adapters else None

    def launch(self, knobs: Knobs) -> SimServer:
        self.launches += 1
        busy = {} if self.other_used_gib is None else {"other_used_gib": self.other_used_gib}
        try:
            cfg = resolve(self.gpu, self.model, knobs, host_gpus=self.host_gpus, lora=self.lora, **busy)
        except LaunchFailure as e:  # the simulator words it as vLLM would: the same facts as a real log's
            e.facts = launch_facts(e.message)
            raise
        seed = self.launch_seed(knobs) if self.launch_seed else self.seed + self.launches
        return SimServer(cfg, self.cost_params, self.noise, seed, self.token_times, self.tokens)
