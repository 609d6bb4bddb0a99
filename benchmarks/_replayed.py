"""The blind strategies, replayed from the ground-truth table (see _harness.py for why that is fair).

Each trial costs one launch and the load runs its capacity measurement needs; what the strategy sees is
the true capacity times the seed's noise for that configuration, exactly what a noisy real run returns.
"""

from __future__ import annotations

import math
import random
import zlib

import optuna

from _harness import NOISE, measure_truth

from tuner.failures import LaunchFailure
from tuner.knobs import Knobs
from tuner.profiles.gpus import get_gpu
from tuner.profiles.models import get_model
from tuner.sim.config import resolve


def noisy(cap: float, seed: int, key: str) -> float:
    rng = random.Random(zlib.crc32(f"{seed}:{key}".encode()))
    return cap * math.exp(rng.gauss(0.0, NOISE))


def replay_whole_space(sc, memo, workload, slo, seed: int, sampler: str, max_launches: int, trace) -> None:
    smp = optuna.samplers.TPESampler(seed=seed, n_startup_trials=5) if sampler == "tpe" \
        else optuna.samplers.RandomSampler(seed=seed)
    study = optuna.create_study(direction="maximize", sampler=smp)
    launches = runs = 0
    seen: dict[str, float] = {}
    best: tuple[float, str] | None = None

    def run(knobs: Knobs) -> float:
        nonlocal launches, runs, best
        key = knobs.key()
        e = measure_truth(sc, knobs, workload, slo, memo)
        launches += 1
        runs += e["runs"]
        val = noisy(e["cap"], seed, key)
        seen[key] = val
        if val and (best is None or val > best[0]):
            best = (val, key)
        trace.add(launches, runs, best[1] if best else None)
        return val

    run(Knobs())  # every strategy starts from vLLM's defaults
    stale = 0
    while launches < max_launches and stale < 200:
        t = study.ask()
        knobs = Knobs(**{k: t.suggest_categorical(k, list(v.values)) for k, v in sc.space.knobs.items()})
        key = knobs.key()
        if sc.space.allows(knobs):
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
            stale += 1
            continue
        if key in seen:  # a sampler repeating itself costs nothing: the user has the number
            study.tell(t, seen[key])
            stale += 1
            continue
        stale = 0
        study.tell(t, run(knobs))


def replay_auto_tune(sc, memo, workload, slo, seed: int, trace) -> None:
    """auto_tune.sh: utilisation back-off from 0.98, then max-num-seqs x max-num-batched-tokens, each
    point measured at rate inf, then stepped down 1 req/s from int(throughput) + 1 until the SLO holds."""
    seqs = sorted(sc.space.knobs["max_num_seqs"].values)
    tokens = sorted(sc.space.knobs["max_num_batched_tokens"].values)
    gpu, model = get_gpu(sc.gpu), get_model(sc.model)
    launches = runs = 0
    best: tuple[float, str] | None = None
    util, found = 0.98, None
    while util >= 0.9 - 1e-9:
        launches += 1
        try:
            resolve(gpu, model, Knobs(gpu_memory_utilization=round(util, 2), max_num_seqs=seqs[-1],
                                      max_num_batched_tokens=tokens[-1]))
            found = round(util, 2)
            break
        except LaunchFailure:
            util -= 0.01
    if found is None:
        return
    for s in seqs:
        for t in tokens:
            if t < s:
                continue
            knobs = Knobs(gpu_memory_utilization=found, max_num_seqs=s, max_num_batched_tokens=t)
            key = knobs.key()
            e = measure_truth(sc, knobs, workload, slo, memo)
            launches += 1
            if e.get("launch_failed"):
                trace.add(launches, runs, best[1] if best else None)
                continue
            cap, mu = noisy(e["cap"], seed, key), noisy(e["mu"], seed + 1, key)
            runs += 1  # the rate-inf run
            if cap >= mu:
                found_cap = mu
            else:
                start = int(mu) + 1
                found_cap = float(math.floor(cap)) if cap >= 1 else 0.0
                runs += max(1, start - int(found_cap))
            if found_cap and (best is None or found_cap > best[0]):
                best = (found_cap, key)
            trace.add(launches, runs, best[1] if best else None)
