"""Trials side by side (issue 59, Must show 2): the wall time of one study with 1, 2 and 4 device sets.

The engine is the HTTP simulator (`--engine sim-http`): a real server process per launch, serving in real
time, so a launch and a load run take real seconds and a set's trial waits on its server as it would on
a GPU; its GPUs are simulated (`--device-kind gpu`, sets of one simulated GPU each, `CUDA_VISIBLE_DEVICES`
set for each set's launches). Each configuration of the study runs its own server, so two sets are two
replicas. Run one after another on one host, in the order 1, 2, 4, 1 (the repeat of 1 set shows drift),
each into a fresh `--out`; printed per run: wall seconds, launches, where each trial ran, and the
recommendation (the best configuration's knobs), which must be the same for every number of sets.

    python benchmarks/parallel_trials.py [--strategy grid] [--sets 1,2,4,1]

The study: `tests/fixtures/tune/space_grid8.yaml` (8 configurations and the baseline), the e2e tests'
tiny workload and SLO, the e2e tests' sim-http load sizes (runs of at most 8 s, precision 0.5).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "tune"
STUDY = ["--workload", FIX / "tiny.jsonl", "--slo", FIX / "tiny.slo.yaml", "--engine", "sim-http",
         "--gpu", "rtx4090", "--model", "qwen2.5-7b", "--search-space", FIX / "space_grid8.yaml",
         "--no-confirm", "--windows", "0", "--requests-per-run", "400", "--max-run-s", "8", "--precision", "0.5",
         "--start-rate", "32", "--max-trials", "9"]


def records(out: Path) -> list[dict]:
    con = sqlite3.connect(out / "study.db")
    try:
        rows = con.execute("SELECT value_json FROM trial_user_attributes WHERE key = 'record'").fetchall()
    finally:
        con.close()
    return [json.loads(v) for (v,) in rows]


def one(sets: int, strategy: str, tmp: Path, n: int) -> dict:
    out = tmp / f"run-{n}-{sets}"
    args = [sys.executable, "-m", "tuner.cli", *map(str, STUDY), "--strategy", strategy, "--out", str(out)]
    if sets > 1:
        args += ["--device-kind", "gpu", "--devices", f"0-{sets - 1}", "--set-size", "1"]
    t0 = time.perf_counter()
    p = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=3600)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"{sets} sets: exit {p.returncode}\n{p.stderr[-3000:]}")
    recs = [r for r in records(out) if not r.get("interrupted")]
    launched = [r for r in recs if r.get("launched")]
    best = max((r for r in recs if r.get("capacity_rps")), key=lambda r: r["capacity_rps"])
    by_set: dict[str, int] = {}
    for r in launched:
        by_set[r.get("device_set") or "-"] = by_set.get(r.get("device_set") or "-", 0) + 1
    return {"sets": sets, "wall_s": wall, "launches": len(launched), "by_set": by_set,
            "best": json.dumps(best["knobs"], sort_keys=True), "best_rps": best["capacity_rps"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--strategy", default="grid")
    ap.add_argument("--sets", default="1,2,4,1")
    a = ap.parse_args()
    order = [int(x) for x in a.sets.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for n, sets in enumerate(order):
            print(f"{sets} device set(s) ...", file=sys.stderr, flush=True)
            rows.append(one(sets, a.strategy, Path(d), n))
            print(f"  {rows[-1]['wall_s']:.1f} s", file=sys.stderr, flush=True)
    one_set = statistics.median(r["wall_s"] for r in rows if r["sets"] == 1)
    print(f"host: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the end; "
          f"strategy {a.strategy}; order {a.sets}")
    print()
    print("| sets | wall s | vs 1 set | launches | trials per set | recommendation | its capacity |")
    print("|---:|---:|---:|---:|---|---|---:|")
    for r in rows:
        per = ", ".join(f"{k}: {v}" for k, v in sorted(r["by_set"].items()))
        print(f"| {r['sets']} | {r['wall_s']:.1f} | {r['wall_s'] / one_set:.2f}x | {r['launches']} | {per} | "
              f"`{r['best']}` | {r['best_rps']:.2f} |")
    same = len({r["best"] for r in rows}) == 1
    print()
    print(f"Same recommendation at every number of sets: {'yes' if same else 'NO'}. "
          f"1 set: median of {sum(r['sets'] == 1 for r in rows)} runs, {one_set:.1f} s.")


if __name__ == "__main__":
    main()
