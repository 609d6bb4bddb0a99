"""Where the twin's first fit starts, measured by what it predicts: the nominal point alone against the
nominal point plus the points read off the launch (`tuner.twin.start`), on the hidden-truth engines.

For each scenario and seed: the baseline (vLLM's defaults) is launched once on the noisy hidden-truth
engine, as a twin study does; the twin is fitted to that launch both ways and predicts a fixed set of
configurations (the truth table's best `--top`, every `--every`-th of the rest, and the defaults).
Printed per scenario: the fit's loss, the median |predicted / truth - 1| over the set (absolute), the
same for the capacity relative to the defaults (what the twin ranks by), and the truth of the twin's
best among the set. More configurations per fit than a study verifies (one or two), so the comparison
is not down to one pick's luck.

Run: python benchmarks/twin_fit_start.py [--seeds 3] [--scenarios ...] [--jobs 2] [--starts launch] [--out F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import ground_truth, load_settings, noisy_runner  # noqa: E402
from _scenarios import SCENARIOS  # noqa: E402
from twin_hidden_truth import scenarios  # noqa: E402

from tuner.knobs import Knobs  # noqa: E402
from tuner.search.strategy import Budget, fitted_baseline  # noqa: E402
from tuner.twin.twin import Twin  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "twin_fit_start.json"


def config_set(gt: dict, top: int, every: int) -> list[str]:
    keys = sorted((k for k in gt if not k.startswith("__") and gt[k]["cap"] > 0), key=lambda k: -gt[k]["cap"])
    return list(dict.fromkeys(keys[:top] + keys[top::every] + ["{}"]))


def one(args) -> dict:
    sc, seed, top, every, starts = args
    workload, slo = sc.workload(), sc.slo()
    gt = ground_truth(sc)
    runner = noisy_runner(sc, seed, workload, slo)
    base = fitted_baseline(runner, Budget(max_trials=1))
    keys = config_set(gt, top, every)
    out = {"scenario": sc.name, "seed": seed, "baseline_measured": base.capacity_rps, "variants": {}}
    for launch_start in [s == "launch" for s in starts]:
        t0 = time.perf_counter()
        twin = Twin.build(sc.gpu, sc.model, workload, slo, load_settings(sc, seed), seed=seed,
                          launch_start=launch_start)
        res = twin.refit([base])
        preds = {k: twin.predict(Knobs(**json.loads(k)), start_rate=base.capacity_rps or 1.0).capacity_rps
                 for k in keys}
        out["variants"]["launch" if launch_start else "nominal"] = {
            "loss": res.loss, "nominal_loss": res.nominal_loss, "start": res.start, "fit_s": res.wall_s,
            "wall_s": round(time.perf_counter() - t0, 1), "params": res.params.model_dump(exclude_none=True),
            "rows": {k: {"predicted": preds[k], "truth": gt[k]["cap"]} for k in keys}}
    return out


def summarise(r: dict) -> dict:
    rows = r["rows"]
    base_p, base_t = rows["{}"]["predicted"], rows["{}"]["truth"]
    abs_err = [abs(v["predicted"] / v["truth"] - 1) for v in rows.values() if v["predicted"] and v["truth"]]
    rel_err = [abs((v["predicted"] / base_p) / (v["truth"] / base_t) - 1) for k, v in rows.items()
               if k != "{}" and v["predicted"] and v["truth"] and base_p and base_t]
    best = max(rows, key=lambda k: rows[k]["predicted"] or 0.0)
    return {"abs": statistics.median(abs_err) if abs_err else None,
            "rel": statistics.median(rel_err) if rel_err else None,
            "best_truth": rows[best]["truth"] / max(v["truth"] for v in rows.values())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--scenarios", default=",".join(s.name for s in SCENARIOS))
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--every", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--starts", default="nominal,launch", help="the first fit's starts to compare")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    scs = scenarios(args.scenarios.split(","))
    t0 = time.perf_counter()
    jobs = [(sc, seed, args.top, args.every, args.starts.split(",")) for seed in range(args.seeds) for sc in scs]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(one, jobs))
    args.out.write_text(json.dumps(results, indent=1))
    print(f"{'scenario':26s} {'seed':>4s}  {'start':8s} {'loss':>6s} {'|err|':>6s} {'|ratio err|':>11s} "
          f"{'best of set':>11s}  fit s")
    agg: dict[str, dict[str, list]] = {}
    for r in results:
        for name, v in r["variants"].items():
            s = summarise(v)
            for m in ("abs", "rel", "best_truth"):
                agg.setdefault(name, {}).setdefault(m, []).append(s[m])
            print(f"{r['scenario']:26s} {r['seed']:4d}  {name:8s} {v['loss']:6.3f} {s['abs']:6.1%} {s['rel']:11.1%} "
                  f"{s['best_truth']:11.1%}  {v['fit_s']:.0f} ({v['start']})")
    for name, m in agg.items():
        print(f"{name:8s}: median |error| {statistics.median(m['abs']):.1%}, |ratio error| "
              f"{statistics.median(m['rel']):.1%}, twin's best of the set at {statistics.median(m['best_truth']):.1%} "
              f"of the set's best (median over {len(m['abs'])} fits; min {min(m['best_truth']):.1%})")
    print(f"total {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
