"""Spread of one configuration's capacity over seeds, against the uncertainty the tool states for it.

The same configuration (vLLM's defaults for Qwen2.5-7B on an RTX 4090, the chat workload and SLO of the
README's main job) is measured by the knee search with ten load seeds: each seed draws other requests
and other arrival times, as another window of the same traffic would. Printed: each seed's capacity and
its stated interval (the highest rate that passed clearly, the lowest that failed clearly), the median,
the spread (min-max, and the sample sd as a % of the median), engine-seconds per capacity, and how many
of the ten capacities fall inside the interval of seed 0's measurement and inside the pooled interval
(the union's tightest common range: max of the lows, min of the highs).

Run: python benchmarks/capacity_spread.py [--seeds 10]. Works on any revision of the package (the
stated interval is reported as n/a where a revision has none).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from tuner.engine.sim import SimEngine  # noqa: E402
from tuner.knobs import Knobs  # noqa: E402
from tuner.capacity.knee import find_capacity  # noqa: E402
from tuner.capacity.measure import LoadSettings  # noqa: E402
from tuner.slo import load_slo  # noqa: E402
from tuner.workload.loader import load_workload  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=10)
    args = ap.parse_args()
    wl = load_workload(ROOT / "workloads" / "chat.jsonl")
    slo = load_slo(ROOT / "workloads" / "chat.slo.yaml")
    eng = SimEngine("rtx4090", "qwen2.5-7b", token_times=False)
    rows = []
    t0 = time.perf_counter()
    for seed in range(args.seeds):
        res = find_capacity(eng.launch(Knobs()), wl, slo, start_rate=1.0, load=LoadSettings(seed=seed),
                            max_num_seqs=256)
        cap = getattr(res, "capacity_rps", None) or res.capacity
        lo, hi = getattr(res, "capacity_low_rps", None), getattr(res, "capacity_high_rps", None)
        rows.append((seed, cap, lo, hi, res.runs, res.engine_s))
        f = lambda x: f"{x:.3f}" if x else "n/a"  # noqa: E731
        print(f"seed {seed}: capacity {f(cap)} req/s, stated [{f(lo)}, {f(hi)}], {res.runs} load runs, "
              f"{res.engine_s:.0f} engine-s", flush=True)
    caps = [r[1] for r in rows if r[1]]
    med = statistics.median(caps)
    sd = statistics.stdev(caps) if len(caps) > 1 else 0.0
    print(f"\nmedian {med:.3f} req/s, min {min(caps):.3f}, max {max(caps):.3f}, sd {100 * sd / med:.1f}% "
          f"of the median; median engine-s per capacity {statistics.median(r[5] for r in rows):.0f}; "
          f"wall {time.perf_counter() - t0:.0f} s")
    lo0, hi0 = rows[0][2], rows[0][3]
    if lo0 or hi0:
        inside = sum(1 for c in caps if (lo0 is None or c >= lo0 * (1 - 1e-9)) and (hi0 is None or c < hi0))
        print(f"{inside} of {len(caps)} capacities inside seed 0's stated interval "
              f"[{lo0 or 0:.3f}, {hi0 or float('inf'):.3f})")
        covered = sum(1 for r in rows if r[1] and (r[2] is None or r[2] <= med) and (r[3] is None or med < r[3]))
        print(f"{covered} of {len(rows)} stated intervals contain the median capacity")
    else:
        print("no stated interval (this revision reports none)")


if __name__ == "__main__":
    main()
