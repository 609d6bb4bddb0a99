"""Shared machinery of the search benchmarks: ground-truth grids, noisy engines, strategy runs.

The ground truth of a scenario is the noise-free capacity of every configuration of its grid, measured
with the same knee search the strategies use. Strategies run with simulator noise on (each launch's GPU
is a few percent faster or slower, drawn from the seed and the configuration), so a strategy that trusts
one lucky measurement is punished as on a real GPU. A strategy's quality after k launches is the
*true* (noise-free) capacity of the configuration it believes best, over the grid optimum.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import optuna

from tuner.engine.sim import SimEngine
from tuner.knobs import Knobs
from tuner.search.capacity import KneeSettings, find_capacity
from tuner.search.measure import LoadSettings
from tuner.search.runner import TrialRunner, knobs_key
from tuner.search.study import TuneOptions, engine_defaults

optuna.logging.set_verbosity(optuna.logging.WARNING)
CACHE = Path(__file__).resolve().parent / ".cache"
NOISE = 0.03
MINUTES_PER_LAUNCH = 2.0      # weights load, profiling, CUDA graphs: a 7B-8B model on one GPU
MINUTES_PER_LOAD_RUN = 1.5    # a ~60 s load run plus drain and scrape


def load_settings(sc, seed: int = 0) -> LoadSettings:
    return LoadSettings(requests=150 if "rag" in sc.name else 500, arrival=sc.arrival, seed=seed)


def true_capacity(sc, knobs: Knobs, workload, slo, memo: dict) -> float:
    """Noise-free capacity of one configuration (0 when it does not launch or never meets the SLO)."""
    key = knobs_key(knobs)
    if key in memo:
        return memo[key]
    from tuner.failures import LaunchFailure

    try:
        server = SimEngine(sc.gpu, sc.model, token_times="itl" in slo.thresholds).launch(knobs)
    except LaunchFailure:
        memo[key] = 0.0
        return 0.0
    r = find_capacity(server, workload, slo, start_rate=1.0, load=load_settings(sc),
                      knee=KneeSettings(precision=0.02), max_num_seqs=server.cfg.max_num_seqs)
    memo[key] = r.capacity or 0.0
    return memo[key]


def _cache_path(sc) -> Path:
    h = hashlib.sha256(json.dumps([sc.name, sc.gpu, sc.model, sc.workload_path, sc.slo_path,
                                   sc.space.model_dump(mode="json"), sc.arrival],
                                  sort_keys=True).encode()).hexdigest()[:12]
    return CACHE / f"{sc.name}-{h}.json"


def ground_truth(sc, use_cache: bool = True) -> dict[str, float]:
    path = _cache_path(sc)
    if use_cache and path.exists():
        return json.loads(path.read_text())
    workload, slo = sc.workload(), sc.slo()
    memo: dict[str, float] = {}
    true_capacity(sc, Knobs(), workload, slo, memo)
    for knobs in sc.space.grid():
        true_capacity(sc, knobs, workload, slo, memo)
    CACHE.mkdir(exist_ok=True)
    path.write_text(json.dumps(memo, indent=0, sort_keys=True))
    return memo


@dataclass
class Trace:
    """What a strategy spent and believed, trial by trial."""

    strategy: str
    seed: int
    points: list[tuple[int, int, str]] = field(default_factory=list)  # (launches, load runs, best key)

    def add(self, launches: int, runs: int, best: str | None) -> None:
        if best is not None:
            self.points.append((launches, runs, best))


def noisy_runner(sc, seed: int, workload, slo, sampler=None) -> TrialRunner:
    engine = SimEngine(sc.gpu, sc.model, noise=NOISE, seed=seed, token_times="itl" in slo.thresholds,
                       launch_seed=lambda k: zlib.crc32(f"{seed}:{knobs_key(k)}".encode()))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    opts = TuneOptions(workload=None, slo=None, out=None, gpu=sc.gpu, model=sc.model)
    return TrialRunner(study=study, engine=engine, workload=workload, slo=slo, space=sc.space,
                       load=load_settings(sc, seed), knee=KneeSettings(precision=0.05),
                       defaults=engine_defaults(opts), start_rate=1.0)


class TraceReporter:
    """Plugs into the trial runner: after each trial, record the cost so far and the believed best."""

    def __init__(self, runner: TrialRunner, trace: Trace, by_measured: bool):
        self.runner, self.trace, self.by_measured = runner, trace, by_measured
        self.runs = 0
        self.best: tuple[float, str] | None = None

    def trial_started(self, number, knobs, role):
        pass

    def point(self, number, p):
        self.runs += p.repeats

    def trial_done(self, rec, incumbent):
        key = knobs_key(Knobs(**rec.knobs))
        cap = rec.capacity_rps or 0.0
        if self.by_measured:
            if cap and not rec.raced_out and (self.best is None or cap > self.best[0]):
                self.best = (cap, key)
        elif rec.accepted:
            self.best = (cap, key)
        self.trace.add(self.runner.launches, self.runs, self.best[1] if self.best else None)
