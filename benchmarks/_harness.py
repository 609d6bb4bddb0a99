"""Shared machinery of the search benchmarks: ground-truth grids, noisy engines, strategy runs.

The ground truth of a scenario is, for every configuration of its grid, the noise-free capacity measured
by the knee search, the load runs that took, and the engine's saturated throughput (a rate-inf run).
Our strategy runs for real on the simulator with noise on (each launch's GPU a few percent faster or
slower, drawn from the seed and the configuration). The blind strategies (TPE, random, auto_tune.sh)
never use what a trial measured except its final capacity, so their trials are replayed from the table:
capacity x exp(N(0, noise)) for the same seed and configuration, at the load-run cost of the full knee
search (TPE, random) or of auto_tune's own step-down (from the table's throughput). That keeps the
benchmark inside 15 minutes on 2 cores and charges the peers no more than a real run would.
A strategy's quality after k launches is the *true* capacity of the configuration it believes best,
over the grid optimum.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import optuna

from tuner.engine.sim import SimEngine
from tuner.knobs import Knobs
from tuner.capacity.knee import KneeSettings, find_capacity
from tuner.capacity.measure import LoadSettings
from tuner.search.runner import TrialRunner
from tuner.settings import from_options
from tuner.study import engine_defaults

optuna.logging.set_verbosity(optuna.logging.WARNING)
CACHE = Path(__file__).resolve().parent / ".cache"
NOISE = 0.03
MINUTES_PER_LAUNCH = 2.0      # weights load, profiling, CUDA graphs: a 7B-8B model on one GPU
MINUTES_PER_LOAD_RUN = 1.5    # a ~60 s load run plus drain and scrape


def load_settings(sc, seed: int = 0) -> LoadSettings:
    """The same request sample for every seed and strategy (seeds vary the GPU's launch noise), so the
    ground truth and every strategy measure one landscape; p99 over a few hundred requests is itself a
    noisy number, and a different sample per seed would move the optimum under the strategies' feet."""
    return LoadSettings(requests=150 if "rag" in sc.name else 500, arrival=sc.arrival, seed=0)


def measure_truth(sc, knobs: Knobs, workload, slo, memo: dict, sample: int = 0) -> dict:
    """{cap, runs, mu}: noise-free capacity (0 when it does not launch or never meets the SLO), the load
    runs the knee search took at 5% precision, and the saturated throughput. `sample` picks another
    request sample of the workload (the table is sample 0)."""
    key = knobs.key() if sample == 0 else f"{knobs.key()}#sample{sample}"
    if key in memo:
        return memo[key]
    from tuner.failures import LaunchFailure

    try:
        server = SimEngine(sc.gpu, sc.model, cost_params=sc.truth,
                           token_times=slo.needs_token_times).launch(knobs)
    except LaunchFailure:
        memo[key] = {"cap": 0.0, "runs": 0, "mu": 0.0, "launch_failed": True}
        return memo[key]
    load = load_settings(sc) if sample == 0 else replace(load_settings(sc), seed=sample)
    r = find_capacity(server, workload, slo, start_rate=1.0, load=load,
                      knee=KneeSettings(precision=0.05), max_num_seqs=server.cfg.max_num_seqs)
    probe = next((p for p in r.points if p.rate >= 1e5), None)
    memo[key] = {"cap": r.capacity or 0.0, "runs": r.runs,
                 "mu": (probe.throughput_rps or 0.0) if probe else 0.0}
    return memo[key]


def true_capacity(sc, knobs: Knobs, workload, slo, memo: dict) -> float:
    return measure_truth(sc, knobs, workload, slo, memo)["cap"]


def _code_digest() -> str:
    """The ground truth is only as current as the code that measured it: the simulator, the profiles, the
    workload and SLO readers and the knee search all go into the cache key (a cache computed before a
    knee-search change once made a stale optimum look unreachable; the whole capacity package counts, as
    the knee's fit in `knee_fit.py` and its settings' defaults in `knee_model.py` moved the truths too)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for sub in ("tuner/sim", "tuner/profiles", "tuner/workload", "tuner/replay", "tuner/engine/sim.py",
                "tuner/capacity", "tuner/slo.py",
                "tuner/knobs.py"):
        path = root / sub
        for f in sorted(path.rglob("*") if path.is_dir() else [path]):
            if f.suffix in (".py", ".yaml") and f.is_file():
                h.update(f.relative_to(root).as_posix().encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:12]


def _cache_path(sc) -> Path:
    h = hashlib.sha256(json.dumps([sc.name, sc.gpu, sc.model, sc.workload_path, sc.slo_path,
                                   sc.space.model_dump(mode="json"), sc.arrival,
                                   load_settings(sc).requests, _code_digest(),
                                   None if sc.truth is None else repr(sc.truth)],
                                  sort_keys=True).encode()).hexdigest()[:12]
    return CACHE / f"{sc.name}-{h}.json"


def ground_truth(sc, use_cache: bool = True) -> dict[str, dict]:
    path = _cache_path(sc)
    if use_cache and path.exists():
        return json.loads(path.read_text())
    workload, slo = sc.workload(), sc.slo()
    memo: dict[str, dict] = {}
    measure_truth(sc, Knobs(), workload, slo, memo)
    for knobs in sc.space.grid():
        measure_truth(sc, knobs, workload, slo, memo)
    grid_best = max(v["cap"] for v in memo.values())
    for knobs in autotune_configs(sc):  # auto_tune.sh's own configurations (utilisation 0.98, ...)
        measure_truth(sc, knobs, workload, slo, memo)
    memo["__grid_optimum__"] = {"cap": grid_best, "runs": 0, "mu": 0.0}
    CACHE.mkdir(exist_ok=True)
    path.write_text(json.dumps(memo, indent=0, sort_keys=True))
    return memo


def autotune_configs(sc) -> list[Knobs]:
    from tuner.failures import LaunchFailure
    from tuner.profiles.gpus import get_gpu
    from tuner.profiles.models import get_model
    from tuner.sim.config import resolve

    seqs = sorted(sc.space.knobs["max_num_seqs"].values)
    tokens = sorted(sc.space.knobs["max_num_batched_tokens"].values)
    util = 0.98
    while util >= 0.9 - 1e-9:
        try:
            resolve(get_gpu(sc.gpu), get_model(sc.model), Knobs(gpu_memory_utilization=round(util, 2),
                    max_num_seqs=seqs[-1], max_num_batched_tokens=tokens[-1]))
            break
        except LaunchFailure:
            util -= 0.01
    return [Knobs(gpu_memory_utilization=round(util, 2), max_num_seqs=s, max_num_batched_tokens=t)
            for s in seqs for t in tokens if t >= s]


@dataclass
class Trace:
    """What a strategy spent and believed, trial by trial."""

    strategy: str
    seed: int
    points: list[tuple[int, int, str]] = field(default_factory=list)  # (launches, load runs, best key)

    def add(self, launches: int, runs: int, best: str | None) -> None:
        if best is not None:
            self.points.append((launches, runs, best))


def noisy_runner(sc, seed: int, workload, slo, sampler=None, noise: float = NOISE) -> TrialRunner:
    launches: dict[str, int] = {}

    def launch_seed(k: Knobs) -> int:
        """The noise draw of a launch: the seed and the configuration pick it, and a second launch of the
        same configuration (a confirmation) draws again, as a real relaunch would."""
        key = k.key()
        launches[key] = launches.get(key, 0) + 1
        n = launches[key]
        return zlib.crc32(f"{seed}:{key}".encode() if n == 1 else f"{seed}:{key}:{n}".encode())

    engine = SimEngine(sc.gpu, sc.model, cost_params=sc.truth, noise=noise, seed=seed,
                       token_times=slo.needs_token_times, launch_seed=launch_seed)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    opts = from_options({"gpu": sc.gpu, "model": sc.model})
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

    def trial_done(self, rec):
        key = rec.config.key()
        cap = rec.capacity_rps or 0.0
        if self.by_measured:
            if cap and not rec.raced_out and (self.best is None or cap > self.best[0]):
                self.best = (cap, key)
        self.trace.add(self.runner.launches, self.runs, self.best[1] if self.best else None)

    def incumbent_changed(self, rec):
        """The strategy stands on `rec` now (after its confirmation launch, the trial just recorded)."""
        if self.by_measured:
            return
        self.best = (rec.capacity_rps or 0.0, rec.config.key())
        if self.trace.points and self.trace.points[-1][0] == self.runner.launches:
            self.trace.points[-1] = (self.runner.launches, self.runs, self.best[1])
        else:
            self.trace.add(self.runner.launches, self.runs, self.best[1])
