"""The twin's ranking with a cheaper first pass: time and agreement with today's full ranking.

`tuner.twin.predict.rank_space` screens every configuration of the space (`SCREEN`) and predicts the best
`REFINE` carefully. With `PRESCREEN` set, every configuration first gets a cheaper knee search and only
the best `PRESCREEN_TOP` are screened as before. For each scenario (benchmarks/_scenarios.py, the twin at
its nominal parameters, as before its first fit) this ranks the space both ways and prints each one's CPU
seconds, the load runs and requests it simulated, and how the fast ranking's top agrees with the full one's:
the top-1 (same configuration?), the top-3 (how many of the full top-3 are in the fast top-3) and the
full top-1's place in the fast ranking.

Run alone (it times one core):
    python benchmarks/twin_rank_prescreen.py [--requests 150] [--precision 0.25] [--top 24] [--scenarios ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import load_settings  # noqa: E402
from _scenarios import SCENARIOS  # noqa: E402

import tuner.capacity.knee as knee_mod  # noqa: E402
import tuner.twin.predict as predict_mod  # noqa: E402
from tuner.knobs import Knobs  # noqa: E402
from tuner.twin.twin import Twin  # noqa: E402


def rank(sc, prescreen) -> dict:
    workload, slo = sc.workload(), sc.slo()
    twin = Twin.build(sc.gpu, sc.model, workload, slo, load_settings(sc), seed=0)
    choices = {k: list(dict.fromkeys(sc.space.knobs[k].values)) for k in sc.space.knobs}
    counts = {"runs": 0, "requests": 0}
    real = knee_mod.measure_run

    def counted(*a, **kw):
        m = real(*a, **kw)
        counts["runs"] += 1
        counts["requests"] += len(m.run.records)
        return m

    shipped = predict_mod.PRESCREEN
    predict_mod.PRESCREEN, knee_mod.measure_run = prescreen, counted
    try:
        t0 = time.process_time()
        ranking = twin.rank(choices, lambda k: sc.space.allows(k, {}) is None, extra=[Knobs()])
        cpu = time.process_time() - t0
    finally:
        predict_mod.PRESCREEN, knee_mod.measure_run = shipped, real
    keys = [p.key for p in ranking.predictions if p.capacity_rps]
    return {"cpu": cpu, "keys": keys, "configs": len(ranking.predictions), **counts,
            "best": ranking.predictions[0].capacity_rps}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=150, help="the first pass's requests a run")
    ap.add_argument("--precision", type=float, default=0.25, help="the first pass's bracket")
    ap.add_argument("--spans", type=float, default=predict_mod.SCREEN.latency_spans)
    ap.add_argument("--top", type=int, default=predict_mod.PRESCREEN_TOP, help="screened after the first pass")
    ap.add_argument("--scenarios", nargs="+", default=[s.name for s in SCENARIOS])
    a = ap.parse_args(argv)
    fast = predict_mod.Fidelity(requests=a.requests, precision=a.precision, careful=False, latency_spans=a.spans)
    predict_mod.PRESCREEN_TOP = a.top
    print(f"first pass: {a.requests} requests, precision {a.precision}, spans {a.spans}; top {a.top} screened")
    print(f"{'scenario':20} {'configs':>7} {'full cpu s':>10} {'fast cpu s':>10} {'runs':>11} {'requests':>15}"
          f"  top-1  top-3  full top-1's place")
    for sc in [s for s in SCENARIOS if s.name in a.scenarios]:
        full, quick = rank(sc, None), rank(sc, fast)
        same1 = "same" if full["keys"][:1] == quick["keys"][:1] else "DIFF"
        top3 = len(set(full["keys"][:3]) & set(quick["keys"][:3]))
        place = quick["keys"].index(full["keys"][0]) + 1 if full["keys"] and full["keys"][0] in quick["keys"] else None
        print(f"{sc.name:20} {full['configs']:7d} {full['cpu']:10.1f} {quick['cpu']:10.1f} "
              f"{full['runs']:5d}/{quick['runs']:<5d} {full['requests']:7d}/{quick['requests']:<7d}  {same1:5}  "
              f"{top3}/3    {place}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
