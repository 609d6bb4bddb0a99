"""Fit the cost model's physical parameters to the fitted part of the calibration set (issue 61).

Coordinate search: each parameter in turn is scaled by factors around its value and kept where the fitted
part's loss (the mean over its figures of |log(simulated / published)|, capped at log 2 so that a few
figures the model cannot reach do not steer the rest) is lowest; rounds until nothing moves. The held-out
part is evaluated once, at the end, with the values found: the fit never sees it.

The values it prints go into `tuner/sim/costs.py` (CostParams) by hand, with their physical meaning; the
fit is a check that they are the set's best, not a step of every run.

Run: python benchmarks/calibration_fit.py [--rounds N] [--params bw_eff,step_overhead_s,...]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _calib_report import stats  # noqa: E402
from calibration_set import evaluate  # noqa: E402

from tuner.profiles.gpus import get_gpu  # noqa: E402
from tuner.sim.costs import CostParams  # noqa: E402

PARAMS = ("bw_eff", "gemm_eff", "attn_eff", "step_overhead_s", "per_seq_overhead_s")
#: per GPU profile: `<gpu key>.<field>` (tuner/profiles/data/gpus.yaml)
GPU_PARAMS = ("h100-sxm.tensor_sustained", "a100-80gb.tensor_sustained", "rtx4090.tensor_sustained")
BOUNDS = {"bw_eff": (0.3, 0.95), "gemm_eff": (0.2, 0.9), "attn_eff": (0.1, 0.9),
          "step_overhead_s": (1e-4, 5e-3), "per_seq_overhead_s": (1e-7, 1e-4), "tensor_sustained": (0.3, 1.0)}
FACTORS = (0.7, 0.85, 0.93, 1.07, 1.18, 1.4)
CAP = math.log(2.0)


def loss(rows) -> float:
    return sum(min(abs(math.log(r[5] / r[4])), CAP) for r in rows) / max(len(rows), 1)


def get(state, name: str) -> float:
    params, gpus = state
    if "." in name:
        key, field = name.split(".")
        return gpus.get(key, {}).get(field, getattr(get_gpu(key), field))
    return getattr(params, name)


def put(state, name: str, v: float):
    params, gpus = state
    if "." in name:
        key, field = name.split(".")
        return params, {**gpus, key: {**gpus.get(key, {}), field: v}}
    return dataclasses.replace(params, **{name: v}), gpus


def run(state, part: bool):
    return evaluate(state[0], part=part, gpus=state[1])[0]


def fit(state, names, rounds: int):
    rows = run(state, False)
    best = loss(rows)
    print(f"start: loss {best:.4f}, fitted part {stats(rows)[1]:.0%} within 25%", flush=True)
    for rnd in range(rounds):
        moved = False
        for name in names:
            lo, hi = BOUNDS[name.split(".")[-1]]
            for f in FACTORS:
                v = min(max(get(state, name) * f, lo), hi)
                trial = put(state, name, v)
                rows = run(trial, False)
                cand = loss(rows)
                if cand < best - 1e-4:
                    best, state, moved = cand, trial, True
                    print(f"round {rnd}: {name} = {v:.4g}: loss {best:.4f}, within 25% {stats(rows)[1]:.0%}",
                          flush=True)
        if not moved:
            break
    return state


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--params", default=",".join(PARAMS + GPU_PARAMS))
    args = ap.parse_args(argv)
    start = (CostParams(), {})
    names = args.params.split(",")
    found = fit(start, names, args.rounds)
    print("\nfitted values (start -> found):")
    for name in names:
        print(f"  {name:30s} {get(start, name):.4g} -> {get(found, name):.4g}")
    for part, label in ((False, "fitted"), (True, "held-out")):
        for st, which in ((start, "start"), (found, "found")):
            rows = run(st, part)
            n, w25, w10, med = stats(rows)
            print(f"{label:8s} part, {which}: {n} figures, within 25% {w25:.0%}, within 10% {w10:.0%}, "
                  f"median |error| {med:.0%}, loss {loss(rows):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
