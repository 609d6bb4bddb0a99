"""Anchor the twin's SLO to what the engine measured.

A fitted twin still misses costs its structure lacks (a per-request cost inside the engine, attention that
slows faster than linearly with the batch), and the SLO's percentile magnifies a small latency bias: a twin
5% slow at p99 TTFT can find no rate that meets an SLO the engine meets at 1.2 req/s. So the twin is
judged against the SLO's thresholds scaled by its own badness at the capacities the launches measured:
its knee of each launched configuration falls where the launch put it, and every other configuration is
predicted relative to those. A constant bias cancels; what is left is the twin's ranking.

The SLO scale puts the edge at a measured capacity, but a knee search reports its highest passing rate,
below the edge, and the launch's own search reported one below its edge as well: on the hidden-truth
engines the twin then predicted the very configurations it was fitted to 3-8% low (chat and rag, three
seeds each). So the capacities are anchored too (`capacity_scale`): every prediction is put
on the launches' scale by the measured / predicted capacity of the launched configurations.
"""

from __future__ import annotations

import math
import statistics
from typing import Callable, Sequence

from tuner.capacity.knee import KneeSearch, KneeSettings
from tuner.capacity.measure import LoadSettings
from tuner.failures import LaunchFailure
from tuner.slo import SLO, Threshold
from tuner.sim.lora import LoraSetup
from tuner.storage.twin import TwinParams
from tuner.twin.engine import TwinEngine

LIMITS = (0.2, 5.0)   # a twin further off than this is not rescued by scaling its SLO
CAPACITY_LIMITS = (0.5, 2.0)   # nor by scaling its capacities


def scaled_slo(slo: SLO, scale: float) -> SLO:
    """`slo` with every threshold times `scale` (percentiles and the target unchanged)."""
    if scale == 1.0:
        return slo
    return slo.model_copy(update={m: Threshold(max_ms=t.max_ms * scale, percentile=t.percentile)
                                  for m, t in slo.thresholds.items()})


def slo_scale(gpu, model, params: TwinParams, anchors: Sequence[tuple[object, float]], workload, slo: SLO,
              load: LoadSettings, knee: KneeSettings, *, shapes: dict | None = None, lora: LoraSetup | None = None) -> float:
    """Geometric mean of the twin's badness at each (knobs, measured capacity) in `anchors`, within `LIMITS`.
    Each is measured as the twin's own knee search measures a rate (`load`, `knee`: a run inside the
    noise is lengthened), so that the same configuration's predicted knee lands on the measured one (a
    p99 over more requests reaches further into a heavy-tailed workload)."""
    logs = []
    for knobs, rate in anchors:
        engine = TwinEngine.for_slo(gpu, model, params, slo, shapes=shapes, lora=lora)
        try:
            server = engine.launch(knobs)
        except LaunchFailure:
            continue
        with server:
            b = KneeSearch(server, workload, slo, load, knee).measure_at(rate).badness
        if b is not None and 0 < b < math.inf:
            logs.append(math.log(min(max(b, LIMITS[0]), LIMITS[1])))
    return math.exp(statistics.fmean(logs)) if logs else 1.0


def capacity_scale(anchors: Sequence[tuple[object, float]], predicted: Callable[[object, float], float | None]) -> float:
    """Geometric mean of measured / predicted capacity over `anchors` (knobs, measured capacity), within
    `CAPACITY_LIMITS`; `predicted(knobs, start_rate)`: the twin's capacity under the SLO scale, unscaled.
    1.0 where the twin predicts no launched configuration a capacity."""
    logs = []
    for knobs, rate in anchors:
        p = predicted(knobs, rate)
        if p and p > 0:
            logs.append(math.log(rate / p))
    if not logs:
        return 1.0
    lo, hi = CAPACITY_LIMITS
    return min(max(math.exp(statistics.fmean(logs)), lo), hi)
