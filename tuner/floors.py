"""Hardware floors of an SLO: what one request gets alone on an idle engine, which no knob can beat.

Every threshold the SLO gives is checked against its own floor, priced by the simulator's cost model
(`tuner.sim.costs.single_stream`, the function the simulated engine's steps come from), so the plan and
the simulator agree on the same GPU and model:

- TTFT floor: the prompt's prefill in one step (the fastest any token budget allows): max(dense GEMM
  compute, one read of the weights) plus attention, for the uncached part of the prompt;
- TPOT floor: the request's mean decode step, the weights plus its KV read once per token over the
  effective bandwidth, plus the step overhead; ITL floor: its last (largest) decode step;
- E2E floor: TTFT floor + (output - 1) x the mean decode step.

Floors are per request (the workload's own prompt and output lengths where the workload file is at hand,
else its mean lengths, and the plan says which). A gate breaks when more requests than the SLO's target
allows have a floor above the threshold: those requests can never be good, whatever the configuration.
The model's context is a gate too: vLLM rejects a request whose prompt + output exceeds max_model_len.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel

from tuner.sim.config import ResolvedConfig
from tuner.sim.costs import CostModel, SingleStream, single_stream
from tuner.slo import SLO
from tuner.workload.stats import prefix_sharing, prompt_length

NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}


@dataclass(frozen=True)
class Lengths:
    """Prompt, output and cacheable-prefix tokens per request, and where they came from."""

    prompt: tuple[int, ...]
    output: tuple[int, ...]
    cached: tuple[int, ...]
    source: str          # "the mean lengths" | "the workload's N requests"

    @classmethod
    def means(cls, prompt: float, output: float) -> "Lengths":
        return cls((max(1, round(prompt)),), (max(1, round(output)),), (0,), "the mean lengths")

    @classmethod
    def of_workload(cls, workload) -> "Lengths":
        """Lengths as the study counted them (`prompt_length`); a prompt sharing blocks with another
        request may find them in the prefix cache, so only its unshared tail counts toward the floor
        (with text prompts that share, all but its last token: a floor must never be too high)."""
        reqs = workload.requests
        prompts = tuple(prompt_length(r) for r in reqs)
        sharing = prefix_sharing(workload)
        shares = bool(sharing and sharing[0] > 0)
        chains = [_id_chain(r) for r in reqs]
        seen: dict[int, int] = {}
        for c in chains:
            for key in c or ():
                seen[key] = seen.get(key, 0) + 1
        cached = []
        for r, p, c in zip(reqs, prompts, chains):
            if c is not None:
                shared = next((i for i, key in enumerate(c) if seen[key] < 2), len(c))
                cached.append(min(shared * r.hash_block_size, p - 1))
            else:
                cached.append(p - 1 if shares else 0)
        return cls(prompts, tuple(r.output_tokens for r in reqs), tuple(cached),
                   f"the workload's {len(reqs)} requests")


def _id_chain(r) -> list[int] | None:
    """Chained keys of a trace's prefix hash ids (equal key = equal prefix up to that block)."""
    if not r.prefix_hash_ids:
        return None
    out, parent = [], 0
    for i in r.prefix_hash_ids:
        parent = hash((parent, r.hash_block_size, i))
        out.append(parent)
    return out


class GateFloor(BaseModel):
    """One SLO threshold against the single-stream floor of the request that decides it."""

    metric: str
    percentile: float
    threshold_ms: float
    floor_ms: float
    ok: bool
    prompt_tokens: int          # the deciding request (the target's rank by floor)
    output_tokens: int
    prefill_ms: float
    decode_step_ms: float       # its mean decode step (ITL: its last)
    message: str


class ContextCheck(BaseModel):
    """Requests longer than the served context: vLLM rejects them (HTTP 400), they are never good."""

    max_model_len: int
    limit_source: str           # "--max-model-len" | "the model's max_position_embeddings"
    longest_tokens: int
    over: int
    requests: int
    ok: bool                    # few enough that the SLO's target still holds
    message: str | None = None


def _ms(s: float) -> str:
    return f"{s:.3g} s" if s >= 1 else f"{s * 1e3:.3g} ms"


def _rank(n: int, target: float) -> int:
    """Index (sorted ascending) of the request that decides the target: the rule `badness` uses."""
    return max(0, math.ceil(target * n) - 1)


def _metric_s(m: str, s: SingleStream) -> float:
    return {"ttft": s.prefill_s, "tpot": s.mean_step_s, "itl": s.last_step_s, "e2el": s.e2e_s}[m]


def _why(m: str, s: SingleStream, p: int, o: int, cost: CostModel, cfg: ResolvedConfig) -> str:
    """The floor's arithmetic, in the words the user checks it with."""
    if m == "ttft":
        return f"the prefill of a {p:,}-token prompt"
    if m == "e2el":
        return (f"{_ms(s.prefill_s)} prefill of {p:,} tokens + {s.decode_steps:,} x "
                f"{s.mean_step_s * 1e3:.3g} ms decode for a {o:,}-token output")
    w_s = cost.decode_floor()
    step = s.last_step_s if m == "itl" else s.mean_step_s
    bw = cfg.gpu.bandwidth_gbs
    return (f"{cfg.weight_bytes / 1e9:.1f} GB of weights / ({cost.params.bw_eff:g} x {bw:g} GB/s) = "
            f"{w_s * 1e3:.1f} ms + {(step - w_s) * 1e3:.2g} ms of KV read and step overhead at "
            f"{p + (o - 1 if m == 'itl' else o // 2):,} tokens of context")


def gate_floors(cfg: ResolvedConfig, slo: SLO, lengths: Lengths) -> list[GateFloor]:
    """Each threshold of `slo` against the single-stream floors of the workload's requests."""
    cost = CostModel(cfg)
    cache_on = cfg.enable_prefix_caching
    memo: dict[tuple[int, int, int], SingleStream] = {}
    streams = []
    for p, o, c in zip(lengths.prompt, lengths.output, lengths.cached):
        key = (p, o, c if cache_on else 0)
        if key not in memo:
            memo[key] = single_stream(cost, p, o, cached_tokens=key[2])
        streams.append((memo[key], p, o))
    target = float(slo.target)  # type: ignore[arg-type]  # set by the SLO validator
    k = _rank(len(streams), target)
    out = []
    for m, t in slo.thresholds.items():
        s, p, o = sorted(streams, key=lambda x: _metric_s(m, x[0]))[k]
        floor_ms = _metric_s(m, s) * 1e3
        ok = t.max_ms >= floor_ms
        which = ("" if len(streams) == 1 else
                 f" (request {k + 1} of {len(streams)} by floor, at the SLO's target {target:g})")
        head = f"p{t.percentile:g} {NAMES[m]} {_ms(t.max_ms / 1e3)}"
        msg = (f"{head} {'>=' if ok else 'is below'} the single-stream floor of {_ms(floor_ms / 1e3)} on "
               f"{cfg.gpu.name}{which}: {_why(m, s, p, o, cost, cfg)}")
        out.append(GateFloor(metric=m, percentile=t.percentile, threshold_ms=t.max_ms, floor_ms=floor_ms,
                             ok=ok, prompt_tokens=p, output_tokens=o, prefill_ms=s.prefill_s * 1e3,
                             decode_step_ms=(s.last_step_s if m == "itl" else s.mean_step_s) * 1e3,
                             message=msg))
    return out


def context_check(cfg: ResolvedConfig, lengths: Lengths, target: float) -> ContextCheck:
    """Prompt + output against the served context (vLLM checks prompt + max_tokens <= max_model_len)."""
    ctx = cfg.max_model_len
    src = "--max-model-len" if cfg.knobs.max_model_len else "the model's max_position_embeddings"
    totals = [p + o for p, o in zip(lengths.prompt, lengths.output)]
    over = sum(t > ctx for t in totals)
    n = len(totals)
    ok = n - over >= target * n
    msg = None
    if over:
        what = (f"the mean request ({lengths.prompt[0]:,} prompt + {lengths.output[0]:,} output tokens)"
                if lengths.source == "the mean lengths" else
                f"{over} of {n} requests ({over / n:.1%}; the longest {max(totals):,} tokens)")
        msg = (f"{what} exceed{'s' if n == 1 else ''} the {ctx:,}-token context of {cfg.model.name} ({src}): "
               "vLLM rejects such requests")
    return ContextCheck(max_model_len=ctx, limit_source=src, longest_tokens=max(totals, default=0), over=over,
                        requests=n, ok=ok, message=msg)


__all__ = ["Lengths", "GateFloor", "ContextCheck", "gate_floors", "context_check", "NAMES"]
