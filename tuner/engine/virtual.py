"""Run a workload through the simulated engine in virtual time.

The clock jumps from step to step (and across idle gaps to the next arrival), so a ten-minute load run
takes a fraction of a second. Output is the same shape the HTTP replay client measures: one
`RequestRecord` per request (arrival, first token, every token's time, finish, error) and a
`MetricsWindow` of vLLM's gauges and counters, so scoring and diagnosis cannot tell the engines apart.
"""

from __future__ import annotations

import functools
import gc
import heapq
from dataclasses import dataclass
from typing import Callable, ParamSpec, Sequence, TypeVar

import numpy as np

from tuner.metrics.window import (GENERATION_TOKENS, LORA_DISK_LOADS, LORA_GPU_LOADS, PREEMPTIONS,
                                  PREFIX_HITS, PREFIX_QUERIES, PROMPT_TOKENS, REQUEST_SUCCESS, SPEC_ACCEPTED, SPEC_DRAFT_TOKENS,
                                  SPEC_DRAFTS, GaugeSample, HistogramDelta, LoraSample, MetricsWindow)
from tuner.replay.record import RequestRecord
from tuner.sim.config import ResolvedConfig
from tuner.sim.costs import CostParams
from tuner.sim.engine import EngineCore, Seq
from tuner.sim.fused import Sampler, decode_steps
from tuner.sim.vllm_metrics import (ITERATION_TOKENS_BUCKETS, REQUEST_LATENCY_BUCKETS,
                                    TTFT_BUCKETS)


#: Plain decode steps run in a row by `tuner.sim.fused.decode_steps` (False: one `step` call each, the reference
#: path `benchmarks/twin_rank_exact.py` compares against: the same numbers, slower).
FUSED_DECODE = True


@dataclass(frozen=True, slots=True)
class SimRequest:
    """What the engine needs of a request: when it arrives, its lengths, its prompt's block hashes."""

    arrival: float
    prompt_len: int
    output_len: int
    hashes: tuple[int, ...] | list[int] = ()
    lora: int = -1  # the adapter's index in the server's `LoraSetup` (-1: the base model)


@dataclass
class VirtualRun:
    records: list[RequestRecord]
    metrics: MetricsWindow
    duration_s: float
    steps: int
    engine: EngineCore


def _hist(values: Sequence[float], buckets: Sequence[float]) -> HistogramDelta:
    arr = np.asarray(values, dtype=float)
    cum = np.searchsorted(np.sort(arr), np.asarray(buckets, dtype=float), side="right")
    b = {float(le): float(c) for le, c in zip(buckets, cum)}
    b[float("inf")] = float(len(arr))
    return HistogramDelta(buckets=b, sum=float(arr.sum()), count=float(len(arr)))


P = ParamSpec("P")
R = TypeVar("R")


def gc_paused(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn` with Python's cyclic garbage collector paused while it runs. A load run allocates a few
    hundred thousand objects that all live until it returns (its requests, records, gauge samples), and
    every 700 allocations the collector scanned them again, the oldest generation the whole heap: a fifth
    of a twin ranking's CPU. Nothing a run allocates needs the collector (it holds no cycles that must
    go early); the pause ends with the call, and the next collection finds whatever is garbage by then."""

    @functools.wraps(fn)
    def paused(*args: P.args, **kwargs: P.kwargs) -> R:
        if not gc.isenabled():  # already paused (a nested call, or the caller's choice)
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            # what the run allocated goes straight to the oldest generation (freeze, then unfreeze) instead
            # of being scanned by the young one at the next allocation: a twentieth of the main job
            gc.freeze()
            gc.unfreeze()
            gc.enable()
    return paused


@gc_paused
def run_virtual(cfg: ResolvedConfig, requests: Sequence[SimRequest], *,
                cost_params: CostParams | None = None, noise: float = 0.0, seed: int = 0,
                sample_interval_s: float = 0.5, request_timeout_s: float | None = None,
                warmup_s: float = 0.0, cooldown_s: float = 0.0, token_times: bool = True,
                engine: EngineCore | None = None, max_concurrency: int | None = None) -> VirtualRun:
    """Replay `requests` (sorted or not) open-loop; every request arrives at its time whatever happens.

    `max_concurrency=C` is the closed loop of `tuner.replay.client`: at most C requests in the engine, a
    request due while all C are busy arrives when one finishes (the end of its step); its record's
    `sent_s` is then that time, `scheduled_s` its due time.

    A request still unfinished `request_timeout_s` after its arrival counts as a timeout (as the replay
    client would abort it) and the run stops once nothing can still finish in time, so an overloaded
    configuration costs bounded work. Pass `engine` to keep one launch's state (its prefix cache)
    across load runs.
    """
    core = engine or EngineCore(cfg, cost_params, noise=noise, seed=seed)
    base_step = core.step_idx
    n = len(requests)
    t0 = core.step_end[-1] if core.step_end else 0.0  # this run's zero on the engine's clock
    sends = _Sends(requests, t0, base_step, max_concurrency, request_timeout_s)
    free_at = sends.free_at
    now = t0
    samples: list[GaugeSample] = []
    lora_samples: list[LoraSample] = []
    lora = core.lora
    sampler = Sampler(0.0, sample_interval_s)
    # the fused decode steps take the gauge samples between their steps (not the LoRA ones: it stops there)
    fused_sampler = sampler if lora is None else None
    it_tokens: list[int] = []
    pool = core.pool
    c0 = _counters(core)
    while True:
        rel = now - t0
        if sends.next_at <= rel:
            sends.send_due(core, rel)
        if not core.running and not core.waiting:  # `core.has_work()`, inlined (every step)
            if sends.i >= n:
                break
            now = max(now, t0 + sends.next_at)
            continue
        if sampler.next_t <= rel:
            _sample(sampler, rel, core, samples, lora_samples)
        if rel > sends.deadline and (sends.i >= n or not max_concurrency):
            break
        if FUSED_DECODE and not max_concurrency:  # plain decode steps up to the next arrival, in one call
            until = sends.next_at
            if fused_sampler is None:  # ... or sample
                until = min(until, sampler.next_t)
            at = core.step_idx
            now = decode_steps(core, now, t0, until, sends.deadline, it_tokens, fused_sampler)
            if sampler.taken:
                samples.extend(_gauge(*x) for x in sampler.taken)
                sampler.taken.clear()
            if core.step_idx != at:
                continue
        dur, finished = core.step(now)
        it_tokens.append(core.last_step_tokens)
        now += dur
        for _ in finished if max_concurrency else ():
            heapq.heappush(free_at, now - t0)
    end_rel = now - t0
    samples.append(GaugeSample(t=end_rel, running=core.num_running, waiting=core.num_waiting,
                               kv_usage=pool.usage))

    records, lat = _records(requests, sends.seqs, sends.errors, sends.sent_rel, core, t0, end_rel,
                            request_timeout_s, token_times)
    _mark_window(records, warmup_s, cooldown_s)
    metrics = _window_metrics(cfg, core, c0, samples, it_tokens, lat, lora_samples)
    return VirtualRun(records=records, metrics=metrics, duration_s=end_rel,
                      steps=core.step_idx - base_step, engine=core)


class _Sends:
    """A run's requests in arrival order, sent into the engine as their time comes: each one's sequence
    or refusal (vLLM's 400), and for the closed loop (`max_concurrency`) the slots' free times and each
    request's real send time. `next_at` is when the next request is due (run seconds; inf once all are
    sent), so the run's loop calls `send_due` only when one is."""

    __slots__ = ("requests", "order", "i", "next_at", "seqs", "errors", "free_at", "sent_rel", "deadline",
                 "t0", "base_step", "max_concurrency", "request_timeout_s")

    def __init__(self, requests: Sequence[SimRequest], t0: float, base_step: int, max_concurrency: int | None,
                 request_timeout_s: float | None):
        self.requests = requests
        self.order = order = sorted(range(len(requests)), key=lambda i: requests[i].arrival)
        self.i = 0
        self.next_at = requests[order[0]].arrival if order else float("inf")
        self.seqs: list[Seq | None] = [None] * len(requests)
        self.errors: dict[int, str] = {}
        last_arrival = requests[order[-1]].arrival if order else 0.0
        self.deadline = last_arrival + request_timeout_s if request_timeout_s else float("inf")
        # closed loop: when each of the C slots became free (run seconds); the deadline then runs from the
        # last real send, once every request is sent
        self.free_at: list[float] = [0.0] * max_concurrency if max_concurrency else []
        self.sent_rel: dict[int, float] = {}
        self.t0 = t0
        self.base_step = base_step
        self.max_concurrency = max_concurrency
        self.request_timeout_s = request_timeout_s

    def send_due(self, core: EngineCore, rel: float) -> None:
        """Send every request due by run time `rel` (in the closed loop, while a slot is free)."""
        requests, order, i, n = self.requests, self.order, self.i, len(self.order)
        max_concurrency, free_at, request_timeout_s = self.max_concurrency, self.free_at, self.request_timeout_s
        while i < n and requests[order[i]].arrival <= rel and (not max_concurrency or free_at):
            idx = order[i]
            r = requests[idx]
            arrival = r.arrival
            if max_concurrency:
                arrival = self.sent_rel[idx] = max(arrival, heapq.heappop(free_at))
                if i == n - 1 and request_timeout_s:
                    self.deadline = arrival + request_timeout_s
            err = core.check(r.prompt_len, r.output_len)
            if err:
                self.errors[idx] = err
                if max_concurrency:  # refused at once: the slot is free again
                    heapq.heappush(free_at, arrival)
            else:
                seq = Seq(rid=idx + self.base_step * 1_000_003, arrival=self.t0 + arrival, prompt_len=r.prompt_len,
                          output_len=r.output_len, hashes=list(r.hashes), lora=r.lora)
                self.seqs[idx] = seq
                core.add(seq)
            i += 1
        self.i = i
        self.next_at = requests[order[i]].arrival if i < n else float("inf")


def _sample(sampler: Sampler, rel: float, core: EngineCore, samples: list[GaugeSample],
            lora_samples: list[LoraSample]) -> None:
    """The gauge samples due by run time `rel` (and the adapters' with LoRA), of the engine as it is now."""
    pool, lora = core.pool, core.lora
    while sampler.next_t <= rel:
        samples.append(_gauge(sampler.next_t, len(core.running), len(core.waiting), pool.usage))
        if lora is not None:
            lora_samples.append(LoraSample(t=sampler.next_t, running=len(lora.running),
                                           waiting=lora.waiting_adapters(core.waiting), max_lora=lora.max_loras))
        sampler.next_t += sampler.interval


def _counters(core: EngineCore) -> tuple:
    """vLLM's cumulative counters of `core` (those a run reports as deltas), the adapters' loads last."""
    lora = core.lora
    return (core.preemptions, core.prefix_queries, core.prefix_hits, core.prompt_tokens,
            core.generation_tokens, core.requests_finished, core.spec_drafts, core.spec_draft_tokens,
            core.spec_accepted, *((lora.gpu_loads, lora.disk_loads) if lora is not None else (0, 0)))


def _records(requests: Sequence[SimRequest], seqs: list, errors: dict[int, str], sent_rel: dict[int, float],
             core: EngineCore, t0: float, end_rel: float, request_timeout_s: float | None,
             token_times: bool) -> tuple[list[RequestRecord], tuple[list, list, list, list]]:
    """Each request's record as the replay client would have measured it, and the latencies the
    engine's histograms see (TTFT, E2E, queue, prefill of the requests that finished in time)."""
    records: list[RequestRecord] = []
    ttfts, e2es, queues, prefills = [], [], [], []
    for idx, r in enumerate(requests):
        seq = seqs[idx]
        sent = sent_rel.get(idx, r.arrival)
        error = errors.get(idx)
        first = finish = times = cached = None
        out_tokens = 0
        end = sent if idx in errors else None
        if seq is not None:
            cached = seq.cached_tokens if seq.first_scheduled is not None else None
            if seq.first_token is not None:
                first = seq.first_token - t0
            if seq.finish is not None and (request_timeout_s is None
                                           or seq.finish - seq.arrival <= request_timeout_s):
                finish = end = seq.finish - t0
                out_tokens = seq.output_len
                ttfts.append(seq.first_token - seq.arrival)
                e2es.append(seq.finish - seq.arrival)
                queues.append((seq.first_scheduled or seq.arrival) - seq.arrival)
                prefills.append(seq.prefill_done - (seq.first_scheduled or seq.arrival))
            else:
                error = "timeout"
                end = sent + request_timeout_s if request_timeout_s else end_rel
                out_tokens = seq.produced
            if token_times and seq.steps:
                times = [x - t0 for x in core.token_times(seq)]
        records.append(_record(idx, r.arrival, sent, first, finish, times, r.prompt_len, out_tokens,
                               r.output_len, error, end, cached, seq is not None))
    return records, (ttfts, e2es, queues, prefills)


_FIELDS = ("index", "scheduled_s", "sent_s", "first_token_s", "finish_s", "token_times", "prompt_tokens",
           "output_tokens", "expected_output_tokens", "error", "in_window", "end_s", "cached_tokens")
_SET = frozenset(_FIELDS[:-1])
_SET_CACHED = frozenset(_FIELDS)
#: `RequestRecord.model_construct` field by field was a tenth of a virtual run; with no validator, alias or
#: post-init to honour, the record's dict is written directly (the same fields, order and fields-set).
_DIRECT = (tuple(RequestRecord.model_fields) == _FIELDS and not RequestRecord.__pydantic_post_init__
           and RequestRecord.model_config.get("extra") != "allow")
_setattr = object.__setattr__


_GAUGE_FIELDS = frozenset(("t", "running", "waiting", "kv_usage"))
_GAUGE_DIRECT = tuple(GaugeSample.model_fields) == ("t", "running", "waiting", "kv_usage") and \
    not GaugeSample.__pydantic_post_init__


#: BaseModel's slots, set through their descriptors: a third cheaper than `object.__setattr__` by name,
#: and a burst's drain takes thousands of samples
_SLOTS = next(c.__dict__ for c in GaugeSample.__mro__ if "__pydantic_fields_set__" in c.__dict__)
_set_fields, _set_extra, _set_private = (_SLOTS[k].__set__ for k in (  # type: ignore[attr-defined]
    "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__"))


def _gauge(t: float, running: int, waiting: int, kv_usage: float) -> GaugeSample:
    """`GaugeSample(...)` without the validator's call (a run takes one every ~1/150 of its span, a long
    drain hundreds): the same floats it would have coerced."""
    if not _GAUGE_DIRECT:
        return GaugeSample(t=t, running=running, waiting=waiting, kv_usage=kv_usage)
    m = GaugeSample.__new__(GaugeSample)
    _setattr(m, "__dict__", {"t": float(t), "running": float(running), "waiting": float(waiting),
                             "kv_usage": float(kv_usage)})
    _set_fields(m, set(_GAUGE_FIELDS))
    _set_extra(m, None)
    _set_private(m, None)
    return m


def _record(index, scheduled, sent, first, finish, times, prompt, out_tokens, expected, error, end, cached,
            cached_set: bool) -> RequestRecord:
    """`RequestRecord.model_construct(...)` of a simulated request (`cached_tokens` set when it ran)."""
    values = {"index": index, "scheduled_s": scheduled, "sent_s": sent, "first_token_s": first,
              "finish_s": finish, "token_times": times, "prompt_tokens": prompt, "output_tokens": out_tokens,
              "expected_output_tokens": expected, "error": error, "in_window": True, "end_s": end,
              "cached_tokens": cached}
    if not _DIRECT:
        if not cached_set:
            del values["cached_tokens"]
        return RequestRecord.model_construct(**values)
    m = RequestRecord.__new__(RequestRecord)
    _setattr(m, "__dict__", values)
    _setattr(m, "__pydantic_fields_set__", set(_SET_CACHED if cached_set else _SET))
    _setattr(m, "__pydantic_extra__", None)
    _setattr(m, "__pydantic_private__", None)
    return m


def _window_metrics(cfg: ResolvedConfig, core: EngineCore, c0: tuple, samples: list[GaugeSample],
                    it_tokens: list[int], lat: tuple[list, list, list, list],
                    lora_samples: list[LoraSample]) -> MetricsWindow:
    """What vLLM's /metrics would have shown over the run: counter deltas (`c0`: `_counters` at its
    start), histograms, cache config; with LoRA, the adapters' loads and gauges."""
    ttfts, e2es, queues, prefills = lat
    d = [b - a for a, b in zip(c0, _counters(core))]
    info = cfg.cache_info()
    metrics = MetricsWindow(
        samples=samples,
        counters={PREEMPTIONS: d[0], PREFIX_QUERIES: d[1], PREFIX_HITS: d[2], PROMPT_TOKENS: d[3],
                  GENERATION_TOKENS: d[4], REQUEST_SUCCESS: d[5],
                  **({SPEC_DRAFTS: d[6], SPEC_DRAFT_TOKENS: d[7], SPEC_ACCEPTED: d[8]} if cfg.spec_tokens else {})},
        histograms={
            "time_to_first_token_seconds": _hist(ttfts, TTFT_BUCKETS),
            "e2e_request_latency_seconds": _hist(e2es, REQUEST_LATENCY_BUCKETS),
            "request_queue_time_seconds": _hist(queues, REQUEST_LATENCY_BUCKETS),
            "request_prefill_time_seconds": _hist(prefills, REQUEST_LATENCY_BUCKETS),
            "iteration_tokens_total": _hist(it_tokens, ITERATION_TOKENS_BUCKETS),
        },
        cache_config={k: info[k] for k in ("gpu_memory_utilization", "cache_dtype", "block_size",
                                            "enable_prefix_caching", "num_gpu_blocks")},
    )
    if core.lora is not None:
        metrics.lora_samples = lora_samples
        metrics.counters[LORA_GPU_LOADS] = d[9]
        metrics.counters[LORA_DISK_LOADS] = d[10]
    return metrics


def _mark_window(records: list[RequestRecord], warmup_s: float, cooldown_s: float) -> None:
    """Requests scheduled in the first `warmup_s` or the last `cooldown_s` of the schedule are measured
    but not scored (the same rule as the HTTP replay client)."""
    if not records or (warmup_s <= 0 and cooldown_s <= 0):
        return
    last = max(r.scheduled_s for r in records)
    for r in records:
        r.in_window = warmup_s <= r.scheduled_s <= last - cooldown_s


def merge_replicas(runs: list[VirtualRun], shares: list[list[int]]) -> tuple[list[RequestRecord], MetricsWindow]:
    """Data-parallel replicas' runs as the one server's: each record back at its index in the load run
    (`shares[k]` lists replica k's), and /metrics as vLLM aggregates its engines: running and waiting
    summed, KV usage averaged, counters and histograms added."""
    n = sum(len(s) for s in shares)
    records: list[RequestRecord | None] = [None] * n
    for run, share in zip(runs, shares):
        for rec, idx in zip(run.records, share):
            rec.index = idx
            records[idx] = rec
    first = runs[0].metrics
    samples = []
    for j in range(max(len(r.metrics.samples) for r in runs)):
        at = [r.metrics.samples[min(j, len(r.metrics.samples) - 1)] for r in runs if r.metrics.samples]
        samples.append(GaugeSample(t=max(s.t for s in at), running=sum(s.running for s in at),
                                   waiting=sum(s.waiting for s in at),
                                   kv_usage=sum(s.kv_usage for s in at) / len(at)))
    counters = {k: sum(r.metrics.counters.get(k, 0.0) for r in runs) for k in first.counters}
    hists = {}
    for name, h in first.histograms.items():
        parts = [r.metrics.histograms[name] for r in runs]
        hists[name] = HistogramDelta(buckets={le: sum(p.buckets.get(le, 0.0) for p in parts) for le in h.buckets},
                                     sum=sum(p.sum for p in parts), count=sum(p.count for p in parts))
    return records, MetricsWindow(samples=samples, counters=counters, histograms=hists,  # type: ignore[arg-type]
                                  cache_config=dict(first.cache_config))
