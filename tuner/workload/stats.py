"""What a workload asks of a server, in the numbers that decide a vLLM configuration.

Prompt lengths drive prefill and KV demand, output lengths drive decode time and the speed gate
(r_inst = T_out / mean output tokens), shared prefixes decide whether prefix caching matters, and a trace's
own rate and burstiness say how hard it pushes. `describe` computes them once for `tune workload inspect`
and for anyone (reports, the search) that wants them.

Prompt text is counted with a `tuner.tokens.TokenCounter`: the model's own tokenizer.json when one is
known, else an estimate whose error depends on the text (see `tuner.tokens`); `token_count` says which.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
from pydantic import BaseModel

from tuner.tokens import RegexCounter, TokenCounter, block_hashes
from tuner.workload.model import Workload, WorkloadRequest
from tuner.workload.prompts import request_text

#: `WorkloadStats.token_count` when no prompt text had to be counted
GIVEN_COUNTS = "prompt tokens as given in the workload file"


class Distribution(BaseModel):
    mean: float
    p50: float
    p90: float
    p99: float
    min: float
    max: float

    @classmethod
    def of(cls, values: list[float] | np.ndarray) -> "Distribution":
        a = np.asarray(values, dtype=float)
        p50, p90, p99 = np.percentile(a, [50, 90, 99])
        return cls(mean=float(a.mean()), p50=float(p50), p90=float(p90), p99=float(p99),
                   min=float(a.min()), max=float(a.max()))


class HistogramBin(BaseModel):
    lo: int
    hi: int
    count: int


class WorkloadStats(BaseModel):
    name: str
    source_format: str
    requests: int
    skipped: int
    prompt_tokens: Distribution
    output_tokens: Distribution
    total_prompt_tokens: int
    total_output_tokens: int
    tenants: int | None = None
    # Of all prompt blocks, the fraction whose whole prefix (this block and all before it) already appeared
    # in an earlier request: the hit rate of an unbounded prefix cache. None when prompts are unknown.
    block_reuse: float | None = None
    # Fraction of requests whose first block is also the first block of some other request.
    requests_sharing_prefix: float | None = None
    duration_s: float | None = None
    arrival_rate: float | None = None
    interarrival_cv: float | None = None  # 1 for Poisson, > 1 bursty
    prompt_histogram: list[HistogramBin]
    # how prompt text was counted: "tokens counted with <folder>/tokenizer.json", the estimate, or given
    token_count: str = GIVEN_COUNTS


def prompt_length(r: WorkloadRequest, tokens: TokenCounter | None = None) -> int:
    """Prompt tokens as given, else counted from the text (default: the estimate), as the simulator
    counts the completions prompt the replay client sends."""
    if r.prompt_tokens is not None:
        return r.prompt_tokens
    return (tokens or RegexCounter()).count(request_text(r) or "")


def token_count_source(workload: Workload, tokens: TokenCounter | None = None) -> str:
    """What `prompt_length` used for this workload: the counter's description, or given counts."""
    counted = any(r.prompt_tokens is None for r in workload.requests)
    return (tokens or RegexCounter()).source if counted else GIVEN_COUNTS


def _chain(r: WorkloadRequest, tokens: TokenCounter) -> list[int] | None:
    """Chained keys of the prompt's blocks (equal key = equal prefix up to and including that block)."""
    if r.prefix_hash_ids:
        out, parent = [], 0
        for i in r.prefix_hash_ids:
            parent = hash((parent, r.hash_block_size, i))
            out.append(parent)
        return out
    text = request_text(r) or None
    if text is None:
        return None
    return block_hashes(tokens.ids(text))


def prefix_sharing(workload: Workload, tokens: TokenCounter | None = None) -> tuple[float, float] | None:
    """(block reuse fraction, fraction of requests sharing a first block), None if prompts are unknown."""
    tokens = tokens or RegexCounter()
    chains = [_chain(r, tokens) for r in workload.requests]
    if any(c is None for c in chains):
        return None
    seen: set[int] = set()
    total = reused = 0
    for c in chains:
        for key in c:  # type: ignore[union-attr]
            total += 1
            if key in seen:
                reused += 1
            else:
                seen.add(key)
    firsts = Counter(c[0] for c in chains if c)  # type: ignore[index]
    sharing = sum(1 for c in chains if c and firsts[c[0]] > 1)  # type: ignore[index]
    return (reused / total if total else 0.0), sharing / len(chains)


def histogram(values: list[int], max_bins: int = 12) -> list[HistogramBin]:
    """Power-of-two bins: prompt lengths span orders of magnitude, linear bins would hide the short ones."""
    lo_exp = int(math.floor(math.log2(max(1, min(values)))))
    hi_exp = int(math.floor(math.log2(max(1, max(values))))) + 1
    step = max(1, math.ceil((hi_exp - lo_exp) / max_bins))
    edges = [2 ** e for e in range(lo_exp, hi_exp + step, step)]
    counts = np.histogram(values, bins=edges)[0]
    return [HistogramBin(lo=a, hi=b, count=int(c)) for a, b, c in zip(edges, edges[1:], counts)]


def describe(workload: Workload, tokens: TokenCounter | None = None) -> WorkloadStats:
    """The statistics; prompt text is counted with `tokens` (default: the estimate)."""
    prompts = [prompt_length(r, tokens) for r in workload.requests]
    outputs = [r.output_tokens for r in workload.requests]
    sharing = prefix_sharing(workload, tokens)
    tenants = {r.tenant for r in workload.requests if r.tenant is not None}
    duration = rate = cv = None
    if workload.has_arrivals and len(workload.requests) > 1:
        t = np.sort(np.asarray([r.arrival_s for r in workload.requests], dtype=float))
        duration = float(t[-1] - t[0])
        if duration > 0:
            rate = (len(t) - 1) / duration
            gaps = np.diff(t)
            cv = float(gaps.std() / gaps.mean())
    return WorkloadStats(
        name=workload.name, source_format=workload.source_format, requests=len(workload.requests),
        skipped=len(workload.skipped), prompt_tokens=Distribution.of(prompts),
        output_tokens=Distribution.of(outputs), total_prompt_tokens=int(sum(prompts)),
        total_output_tokens=int(sum(outputs)), tenants=len(tenants) or None,
        block_reuse=sharing[0] if sharing else None,
        requests_sharing_prefix=sharing[1] if sharing else None,
        duration_s=duration, arrival_rate=rate, interarrival_cv=cv, prompt_histogram=histogram(prompts),
        token_count=token_count_source(workload, tokens))
