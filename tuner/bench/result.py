"""`tune bench`: one load run against a running server, reported exactly as `vllm bench serve` reports it.

Why: users check a configuration against `vllm bench serve` numbers (their own, or published ones). The
run itself is the project's replay client (`tuner.replay.client`: open loop, or closed loop with
`max_concurrency`), the schedule the project's (`tuner.workload.arrivals`), and the per-request metrics
`RequestRecord`'s (TTFT, TPOT, ITL, E2EL, as `bench serve` defines them); only the aggregation and the
layout below are `bench serve`'s, from `vllm/benchmarks/serve.py` (`calculate_metrics`, `benchmark`):

- A request is *completed* when its stream ended normally (`RequestRecord.ok`), *failed* otherwise.
- Input/output tokens: the usage block's counts of completed requests.
- TPOT: per request (E2EL - TTFT) / (output tokens - 1), requests of one output token left out.
  ITL: every inter-token gap of every completed request, pooled. TTFT, E2EL: per completed request.
- Mean (`np.mean`), median (`np.median`), std (`np.std`) and `np.percentile` (linear) for each.
- Duration: first send to last completion (`run_span`); every throughput is a count over it. Goodput:
  requests good under the SLO (`tuner.slo.is_good`, the per-request check) over the same duration.
"""

from __future__ import annotations

import math
import random
import time
from typing import Iterable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from tuner.errors import UserError
from tuner.replay.record import TOOL_CAUSES, LoadRun, RequestRecord
from tuner.slo import SLO, is_good
from tuner.workload.arrivals import gamma_times, poisson_times, trace_times
from tuner.workload.model import Workload, WorkloadRequest

#: (key in vLLM's result, name in its table, header of its table section), in vLLM's order.
METRICS: tuple[tuple[str, str, str], ...] = (
    ("ttft", "TTFT", "Time to First Token"),
    ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
    ("itl", "ITL", "Inter-token Latency"),
    ("e2el", "E2EL", "End-to-end Latency"),
)


class BenchResult(BaseModel):
    """What `vllm bench serve --save-result` writes, under its key names, plus `max_in_flight` (ours).

    The percentile keys `p<q>_<metric>_ms` (vLLM's spelling: `p99_ttft_ms`, `p99.9_ttft_ms`) are extra
    fields, one per `--metric-percentiles` value, as vLLM adds them."""

    model_config = ConfigDict(extra="allow")
    date: str
    backend: str
    model_id: str | None
    num_prompts: int
    request_rate: float | str  # "inf" for a burst, as vLLM writes it
    burstiness: float
    max_concurrency: int | None
    duration: float
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    request_goodput: float | None
    output_throughput: float
    total_token_throughput: float
    mean_ttft_ms: float
    median_ttft_ms: float
    std_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    std_tpot_ms: float
    mean_itl_ms: float
    median_itl_ms: float
    std_itl_ms: float
    mean_e2el_ms: float
    median_e2el_ms: float
    std_e2el_ms: float
    #: Most requests in flight at once, counted at the client from the send and end times (not vLLM's
    #: per-second "peak concurrent requests", which counts two back-to-back requests in one second twice).
    max_in_flight: int
    goodput_slo: str | None = None
    errors: list[str] = []


def bench_schedule(workload: Workload, num_prompts: int, rate: float, arrival: str = "poisson",
                   burstiness: float = 1.0, seed: int = 0) -> tuple[list[WorkloadRequest], list[float]]:
    """The first `num_prompts` requests of the workload (cycling through a shorter one, as `bench serve`
    oversamples) and their send times: all 0 at rate inf; Poisson or Gamma draws at `rate`; a trace's
    own timestamps (rescaled to `rate` when it is finite)."""
    if num_prompts < 1:
        raise UserError(f"must be >= 1, got {num_prompts}", field="--num-prompts")
    reqs = workload.requests
    if not reqs:
        raise UserError("the workload has no requests", file=workload.name)
    if arrival == "trace":
        if num_prompts > len(reqs):
            raise UserError(f"the trace has {len(reqs)} requests, fewer than --num-prompts {num_prompts}",
                            file=workload.name, field="--num-prompts")
        part = workload.model_copy(update={"requests": reqs[:num_prompts]})
        times = trace_times(part)
        if math.isfinite(rate) and num_prompts > 1 and times[-1] > 0:
            k = (num_prompts - 1) / rate / times[-1]
            times = [t * k for t in times]
        return list(part.requests), times
    chosen = [reqs[i % len(reqs)] for i in range(num_prompts)]
    if math.isinf(rate):
        return chosen, [0.0] * num_prompts
    if arrival == "gamma":
        return chosen, gamma_times(num_prompts, rate, burstiness, seed)
    if arrival == "poisson":
        return chosen, poisson_times(num_prompts, rate, seed)
    raise UserError(f"unknown arrival process {arrival!r} (known: poisson, gamma, trace)", field="--arrival")


#: `vllm bench serve --lora-assignment` choices (vllm/benchmarks/serve.py).
LORA_ASSIGNMENTS = ("random", "round-robin")


def assign_adapters(requests: Sequence[WorkloadRequest], adapters: Sequence[str], assignment: str = "random",
                    seed: int = 0) -> list[WorkloadRequest]:
    """Each request sent to one of `adapters`, as `vllm bench serve --lora-modules A B ... --lora-assignment`
    picks them: `round-robin` gives request i `adapters[i % n]` in the schedule's order (the same adapter
    per request as vLLM's client, whose order is the dataset's); `random` draws one per request, uniformly
    (vLLM: `random.choice` on its global generator seeded by `--seed`, after its other draws, so the same
    distribution, not the same draws). A request's own `lora` is replaced, as vLLM replaces the model."""
    if not adapters:
        return list(requests)
    if assignment == "round-robin":
        names = [adapters[i % len(adapters)] for i in range(len(requests))]
    elif assignment == "random":
        rng = random.Random(seed)
        names = [rng.choice(list(adapters)) for _ in requests]
    else:
        raise UserError(f"must be one of {', '.join(LORA_ASSIGNMENTS)}, got {assignment!r}",
                        field="--lora-assignment")
    return [r.model_copy(update={"lora": name}) for r, name in zip(requests, names)]


def sent_records(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    """Requests that went to the server: not those the tool itself left out or cut (`TOOL_CAUSES`)."""
    return [r for r in records if r.sent_s is not None and r.cause not in TOOL_CAUSES]


def run_span(records: Iterable[RequestRecord]) -> float:
    """Seconds from the first send to the last end (completion or failure): `bench serve`'s duration."""
    return sent_span(sent_records(records))


def sent_span(sent: list[RequestRecord]) -> float:
    """`run_span` of records that are `sent_records` already (not filtered again)."""
    if not sent:
        return 0.0
    end = max((r.end_s or r.finish_s or r.sent_s or 0.0) for r in sent)
    return max(0.0, end - min(r.sent_s for r in sent))  # type: ignore[type-var]


def max_in_flight(records: Iterable[RequestRecord]) -> int:
    """Most requests between their send and their end at any instant (an end before a send at the same
    time frees the slot first, as the closed loop does)."""
    events = []
    for r in sent_records(records):
        events.append((r.sent_s, 1))
        events.append((r.end_s if r.end_s is not None else math.inf, -1))
    peak = now = 0
    for _, d in sorted(events, key=lambda e: (e[0], e[1])):
        now += d
        peak = max(peak, now)
    return peak


def _stats(values: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    """vLLM's statistics of one metric in ms (`np.mean(values or 0)`: 0 when nothing was measured)."""
    v = list(values) or [0.0]
    out = {"mean": float(np.mean(v)) * 1e3, "median": float(np.median(v)) * 1e3, "std": float(np.std(v)) * 1e3}
    for p in percentiles:
        out[f"p{pct_word(p)}"] = float(np.percentile(v, p)) * 1e3
    return out


def pct_word(p: float) -> str:
    """vLLM's spelling of a percentile in keys and labels: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if int(p) == p else str(p)


def bench_result(run: LoadRun, *, rate: float, burstiness: float, max_concurrency: int | None,
                 model: str | None, api: str, percentiles: Sequence[float] = (99.0,),
                 slo: SLO | None = None) -> BenchResult:
    """`bench serve`'s result of one load run (the definitions are in the module docstring)."""
    sent = sent_records(run.records)
    done = [r for r in sent if r.ok]
    duration = run_span(run.records)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    total_in = sum(r.prompt_tokens or 0 for r in done)
    total_out = sum(r.output_tokens for r in done)
    values = {
        "ttft": [r.ttft for r in done if r.ttft is not None],
        "tpot": [r.tpot for r in done if r.output_tokens > 1 and r.tpot is not None],
        "itl": [g for r in done for g in r.itls],
        "e2el": [r.e2el for r in done if r.e2el is not None],
    }
    fields: dict = {}
    for key, _, _ in METRICS:
        for stat, v in _stats(values[key], percentiles).items():
            fields[f"{stat}_{key}_ms"] = v
    good = sum(1 for r in done if is_good(r, slo)) if slo is not None else None
    errors = sorted({r.error for r in sent if r.error})[:10]
    return BenchResult(
        date=time.strftime("%Y%m%d-%H%M%S"), backend="openai-chat" if api == "chat" else "openai",
        model_id=model, num_prompts=len(run.records), request_rate="inf" if math.isinf(rate) else rate,
        burstiness=burstiness, max_concurrency=max_concurrency, duration=duration, completed=len(done),
        failed=len(sent) - len(done), total_input_tokens=total_in, total_output_tokens=total_out,
        request_throughput=per_s(len(done)), request_goodput=per_s(good) if good is not None else None,
        output_throughput=per_s(total_out), total_token_throughput=per_s(total_in + total_out),
        max_in_flight=max_in_flight(run.records), goodput_slo=slo.describe() if slo is not None else None,
        errors=errors, **fields)


def format_table(res: BenchResult, percentiles: Sequence[float] = (99.0,)) -> str:
    """The "Serving Benchmark Result" table, line for line as `bench serve` prints it."""
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]

    def row(label: str, value, fmt: str = "{:<10}") -> None:
        lines.append("{:<40} ".format(label) + fmt.format(value))

    f2 = "{:<10.2f}"
    row("Successful requests:", res.completed)
    row("Failed requests:", res.failed)
    if res.max_concurrency is not None:
        row("Maximum request concurrency:", res.max_concurrency)
    if res.request_rate != "inf":
        row("Request rate configured (RPS):", float(res.request_rate), f2)
    row("Benchmark duration (s):", res.duration, f2)
    row("Total input tokens:", res.total_input_tokens)
    row("Total generated tokens:", res.total_output_tokens)
    row("Request throughput (req/s):", res.request_throughput, f2)
    if res.request_goodput is not None:
        row("Request goodput (req/s):", res.request_goodput, f2)
    row("Output token throughput (tok/s):", res.output_throughput, f2)
    row("Total token throughput (tok/s):", res.total_token_throughput, f2)
    extra = res.model_extra or {}
    for key, name, header in METRICS:
        lines.append("{s:{c}^{n}}".format(s=header, n=50, c="-"))
        row(f"Mean {name} (ms):", getattr(res, f"mean_{key}_ms"), f2)
        row(f"Median {name} (ms):", getattr(res, f"median_{key}_ms"), f2)
        for p in percentiles:
            row(f"P{pct_word(p)} {name} (ms):", extra[f"p{pct_word(p)}_{key}_ms"], f2)
    lines.append("=" * 50)
    return "\n".join(lines)
