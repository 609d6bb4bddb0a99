"""A configuration's capacity on a fixed set of request windows, on a rate grid every configuration shares.

Why: a knee search's capacity is the highest rate its own path happened to visit and pass, and two
configurations' searches visit different rates; on the main job two configurations the engine serves
identically read 3-8% apart for that alone, and a difference of that size decided recommendations. Here
every configuration is measured on the same windows (a window: one request sample and its arrival
pattern, drawn from a window seed, stretched to each rate: common random numbers) at the same rates (the
grid `(1 + step) ** k`, `k` an integer, the same for every configuration and window). A window's capacity
is the highest grid rate that passed with the next grid rate failing. Two configurations the engine
serves alike then read exactly alike, and what differs between them is the engine's doing; the spread
over windows is the sampling noise a paired comparison (`tuner.capacity.paired`) puts an interval on.

This module measures and decides nothing: the windows' capacities go into the trial's record, and the
recommendation (`tuner.recommend`) pairs them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from tuner.capacity.knee import KneeSearch
from tuner.capacity.knee_model import KneeSettings
from tuner.capacity.measure import LoadSettings, measure
from tuner.engine.base import Server
from tuner.slo import SLO
from tuner.storage.records import LoadRunSummary, WindowCapacity
from tuner.workload.model import Workload

#: Load runs one window may take (a gallop up or down, then a bisection on the grid).
MAX_RUNS_PER_WINDOW = 10


@dataclass(frozen=True)
class WindowPlan:
    """Which windows every configuration of a study is measured on, and the rate grid they share."""

    seeds: tuple[int, ...]
    step: float = 0.025   # the grid's relative step: half the knee search's default precision

    def rate(self, k: int) -> float:
        return (1.0 + self.step) ** k

    def index(self, rate: float) -> int:
        return int(math.floor(math.log(rate) / math.log(1.0 + self.step) + 1e-9))


def window_seeds(seed: int, n: int) -> tuple[int, ...]:
    """`n` window seeds drawn from the study's seed (not seed, seed + 1, ...: two studies whose seeds are
    one apart share no window, so their answers are independent evidence)."""
    state = np.random.SeedSequence([int(seed), 0x5EED]).generate_state(n)
    return tuple(int(x) % (2 ** 31 - 1) for x in state)


#: Windows a configuration at most where `--windows` is not given, in virtual time (`default_windows`).
VIRTUAL_WINDOWS = 12


def default_windows(virtual_time: bool) -> int:
    """`--windows` not given: `VIRTUAL_WINDOWS` on the in-process simulator (CPU seconds, not engine time);
    off on real-time engines, where a window is a few full load runs and the paired check's cost and its
    agreement with an independent client have not been measured yet."""
    return VIRTUAL_WINDOWS if virtual_time else 0


def plan_for(seed: int, count: int, step: float = 0.025) -> WindowPlan:
    """`count` windows of the study seeded `seed`. On the main job one window's paired capacity ratio
    spreads by ~6% (30 windows, 1,000 requests each: FP8 KV against the defaults +7.7%, sd 6.3%), so 12
    windows put a 95% interval of about +-4% on a difference."""
    return WindowPlan(seeds=window_seeds(seed, count), step=step)


def measure_windows(server: Server, workload: Workload, slo: SLO, load: LoadSettings, plan: WindowPlan,
                    start_rate: float, *, knee: KneeSettings | None = None, max_num_seqs: int | None = None,
                    on_point: Callable[[LoadRunSummary], None] | None = None,
                    enough: Callable[[list[WindowCapacity]], bool] | None = None,
                    out: list[WindowCapacity] | None = None) -> tuple[list[WindowCapacity], float]:
    """Each window's capacity on the launched `server` (see the module docstring), and the engine seconds
    it took. `start_rate`: where every window's search starts; the study gives every configuration the
    same one (vLLM's defaults' knee), so no configuration's window capacity is anchored to another's
    (a search that starts at the other's capacity finds the boundary nearest it, and shrank the differences). `enough(windows so far)`: the comparison these
    windows are for is decided, the rest of the plan's windows are not measured. `out`: the list each
    finished window is appended to as it finishes (an interrupted caller keeps what was done)."""
    knee = knee or KneeSettings()
    warm = KneeSearch(server, workload, slo, load, knee, max_num_seqs=max_num_seqs)
    warm.warm_up(start_rate)
    engine_s = warm.result.engine_s
    out = [] if out is None else out
    salt = 1 + 10_000 * (load.seed % 100_000)
    start = plan.index(max(start_rate, knee.min_rate))
    floor_k = plan.index(knee.min_rate) + 1
    for seed in plan.seeds:
        verdicts: dict[int, bool] = {}
        run_load = replace(load, seed=seed)

        def passed(k: int) -> bool:
            nonlocal salt, engine_s
            if k not in verdicts:
                salt += 1
                m, run = measure(server, workload, slo, plan.rate(k), run_load, seed=seed,
                                 max_num_seqs=max_num_seqs, salt=salt)
                engine_s += run.duration_s
                verdicts[k] = bool(m.summary.passed)
                if on_point is not None:
                    on_point(m.summary)
            return verdicts[k]

        k = _highest_pass(passed, start, floor_k, lambda: len(verdicts) >= MAX_RUNS_PER_WINDOW)
        cap = plan.rate(k) if k is not None else None
        out.append(WindowCapacity(seed=seed, capacity_rps=cap, runs=len(verdicts),
                                  bracketed=k is not None and verdicts.get(k + 1) is False))
        if enough is not None and enough(out):
            break
    return out, engine_s


def _highest_pass(passed: Callable[[int], bool], start: int, floor_k: int,
                  spent: Callable[[], bool]) -> int | None:
    """The highest grid index that passed with the next one failing: a gallop from `start` (up while it
    passes, down while it fails, doubling the step), then a bisection of the bracket. None: nothing passed
    down to `floor_k`."""
    if passed(start):
        lo, step = start, 1
        while not spent() and passed(lo + step):
            lo, step = lo + step, step * 2
        hi = lo + step
    else:
        hi, step = start, 1
        while True:
            if hi - step < floor_k:
                lo = floor_k
                if not passed(lo):
                    return None
                break
            if passed(hi - step):
                lo = hi - step
                break
            if spent():
                return None
            hi, step = hi - step, step * 2
    while hi - lo > 1 and not spent():
        mid = (lo + hi) // 2
        if passed(mid):
            lo = mid
        else:
            hi = mid
    return lo
