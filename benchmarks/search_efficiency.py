"""Search cost and quality: ours (diagnosis-guided, one knob at a time) against the peers' strategies.

For each scenario (benchmarks/_scenarios.py) the exhaustive grid is measured noise-free (the ground
truth, cached in benchmarks/.cache/; --fresh recomputes it). Then each strategy runs on the same
landscape with simulator noise on, over several seeds: ours, Optuna TPE over the whole space, random
search, and vLLM's auto_tune.sh algorithm; `ours-exact` is ours once on the noise-free simulator (what
`tune --engine sim` runs: issue 5's "95% of the grid optimum within 15 launches"). Printed per scenario and strategy: engine launches and load
runs to reach 90/95/98% of the grid optimum (median [min-max] over seeds; '-' = not reached), the
GPU-minutes that costs, and the true capacity it ends with. Writes benchmarks/results/search_efficiency.json
and a plot (capacity vs launches, one line per strategy).

Run: python benchmarks/search_efficiency.py [--seeds 10] [--scenarios chat-rtx4090,...] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (MINUTES_PER_LAUNCH, MINUTES_PER_LOAD_RUN, NOISE, Trace, TraceReporter,  # noqa: E402
                      ground_truth, noisy_runner, true_capacity)
from _replayed import replay_auto_tune, replay_whole_space  # noqa: E402
from _scenarios import SCENARIOS  # noqa: E402

from tuner.search.strategies.guided import guided  # noqa: E402
from tuner.search.strategy import Budget  # noqa: E402

LEVELS = (0.90, 0.95, 0.98)
CAPS = {"ours": 15, "ours-exact": 15, "tpe": 40, "random": 40}
OUT = Path(__file__).resolve().parent / "results"


def run_one(args) -> dict:
    sc_name, strategy, seed, gt = args
    sc = next(s for s in SCENARIOS if s.name == sc_name)
    workload, slo = sc.workload(), sc.slo()
    trace = Trace(strategy, seed)
    memo = dict(gt)
    t0 = time.perf_counter()
    if strategy == "autotune":
        replay_auto_tune(sc, memo, workload, slo, seed, trace)
    elif strategy in ("tpe", "random"):
        replay_whole_space(sc, memo, workload, slo, seed, strategy, CAPS[strategy], trace)
    else:  # ours, for real on the noisy simulator (or the deterministic one: `tune --engine sim`)
        runner = noisy_runner(sc, seed, workload, slo, noise=0.0 if strategy == "ours-exact" else NOISE)
        runner.reporter = TraceReporter(runner, trace, by_measured=False)
        guided(runner, Budget(max_trials=CAPS[strategy]), noise_floor=0.05)
    opt = gt["__grid_optimum__"]["cap"]
    curve = [(l, r, true_capacity(sc, _knobs(k), workload, slo, memo) / opt) for l, r, k in trace.points]
    new = {k: v for k, v in memo.items() if k not in gt}
    return {"scenario": sc_name, "strategy": strategy, "seed": seed, "curve": curve,
            "wall_s": time.perf_counter() - t0, "new_truth": new}


def _knobs(key: str):
    from tuner.knobs import Knobs
    return Knobs(**json.loads(key))


def first_reaching(curve, level):
    for launches, runs, q in curve:
        if q >= level - 1e-9:
            return launches, runs
    return None


def fmt(values):
    vals = [v for v in values if v is not None]
    if len(vals) < len(values) / 2:
        return f"- ({len(vals)}/{len(values)})"
    ordered = sorted(values, key=lambda v: float("inf") if v is None else v)
    med = ordered[(len(ordered) - 1) // 2]  # lower median; a miss counts as infinitely many
    med = "-" if med is None else f"{med:g}"
    return f"{med} [{min(vals)}-{max(vals)}]" + ("" if len(vals) == len(values) else f" ({len(vals)}/{len(values)})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--scenarios", default=",".join(s.name for s in SCENARIOS))
    ap.add_argument("--strategies", default="ours-exact,ours,tpe,random,autotune",
                    help="ours-exact = ours on the noise-free simulator (deterministic: one run, seed 0)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--fresh", action="store_true", help="recompute the ground-truth grids")
    args = ap.parse_args(argv)
    names = args.scenarios.split(",")
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        gts = dict(zip(names, pool.map(_gt, [(n, not args.fresh) for n in names])))
        print(f"ground truth ready in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        jobs = [(n, st, seed, gts[n]) for n in names for st in args.strategies.split(",")
                for seed in (range(1) if st == "ours-exact" else range(args.seeds))]
        results = list(pool.map(run_one, jobs))
    OUT.mkdir(exist_ok=True)
    summary = {"machine": os.uname().machine, "cores": os.cpu_count(), "seeds": args.seeds,
               "minutes_per_launch": MINUTES_PER_LAUNCH, "minutes_per_load_run": MINUTES_PER_LOAD_RUN,
               "scenarios": {}}
    for n in names:
        gt = {k: v["cap"] for k, v in gts[n].items() if k != "__grid_optimum__"}
        opt_key = max((k for k in gt if gt[k] == gts[n]["__grid_optimum__"]["cap"]), key=len)
        base = gt.get("{}", 0.0)
        print(f"\n## {n}: grid optimum {gt[opt_key]:.2f} req/s with {opt_key}; vLLM defaults {base:.2f} "
              f"({base / gt[opt_key]:.0%}); {len(sc_grid(n))} grid configurations")
        print(f"{'strategy':10s} " + " ".join(f"{'launches to ' + format(l, '.0%'):>22s}" for l in LEVELS)
              + f" {'load runs to 95%':>18s} {'GPU-min to 95%':>15s} {'final':>14s}")
        rows = {}
        for st in args.strategies.split(","):
            rs = [r for r in results if r["scenario"] == n and r["strategy"] == st]
            reach = {lv: [first_reaching(r["curve"], lv) for r in rs] for lv in LEVELS}
            finals = [r["curve"][-1][2] if r["curve"] else 0.0 for r in rs]
            r95 = [x[1] if x else None for x in reach[0.95]]
            gpu = [None if x is None else x[0] * MINUTES_PER_LAUNCH + x[1] * MINUTES_PER_LOAD_RUN
                   for x in reach[0.95]]
            rows[st] = {"launches": {str(lv): [x[0] if x else None for x in reach[lv]] for lv in LEVELS},
                        "load_runs_95": r95, "gpu_minutes_95": gpu, "final": finals,
                        "curves": [r["curve"] for r in rs]}
            print(f"{st:10s} " + " ".join(f"{fmt([x[0] if x else None for x in reach[lv]]):>22s}"
                                          for lv in LEVELS)
                  + f" {fmt(r95):>18s} {fmt([None if g is None else round(g) for g in gpu]):>15s}"
                  + f" {statistics.median(finals):>6.1%} (min {min(finals):.0%})")
        summary["scenarios"][n] = {"optimum": gt[opt_key], "optimum_knobs": opt_key, "baseline": base,
                                   "grid_size": len(gt), "strategies": rows}
    (OUT / "search_efficiency.json").write_text(json.dumps(summary, indent=1))
    _plot(summary, OUT / "search_efficiency.png")
    print(f"\ntotal {time.perf_counter() - t0:.0f} s; wrote {OUT / 'search_efficiency.json'}", file=sys.stderr)
    return 0


def sc_grid(name):
    return next(s for s in SCENARIOS if s.name == name).space.grid()


def _gt(args):
    name, use_cache = args
    return ground_truth(next(s for s in SCENARIOS if s.name == name), use_cache)


def _plot(summary, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["scenarios"])
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6), squeeze=False)
    for ax, n in zip(axes[0], names):
        for st, row in summary["scenarios"][n]["strategies"].items():
            xs = range(1, 41)
            med = []
            for x in xs:
                vals = []
                for curve in row["curves"]:
                    q = [c[2] for c in curve if c[0] <= x]
                    vals.append(q[-1] if q else 0.0)
                med.append(statistics.median(vals) if vals else 0.0)
            ax.plot(list(xs), med, label=st)
        ax.axhline(0.95, color="grey", lw=0.8, ls="--")
        ax.set_title(n, fontsize=9)
        ax.set_xlabel("engine launches")
        ax.set_ylim(0, 1.02)
    axes[0][0].set_ylabel("true capacity / grid optimum (median)")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
