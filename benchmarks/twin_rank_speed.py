"""How fast the twin ranks a whole search space, and what the screen's size does to the ranking.

Issue 15's target: 100 configurations, a knee search each, in under 30 s on one core. The twin screens
every configuration with a cheap knee search (`tuner.twin.predict.SCREEN`) and predicts the best
`REFINE` again carefully. A screening run shorter than the steady-state rule's minimum span is
`too_short` and is run again twice as long, so a screen sized too small costs more than one sized right.

For each scenario (the hidden-truth engines of twin_hidden_truth.py; the twin has its nominal
parameters, as before its first fit, which is what matters for speed) and each screen size: the wall
time of `rank_space`, the load runs and simulated requests it took, how many screening runs were too
short, and the ranking's top configuration and top-5 set, so a faster screen that ranks differently shows.

Run alone (it times one core):
    python benchmarks/twin_rank_speed.py [--screens 300 600] [--spans 3 1.5] [--precision 0.1 0.2] [--scenarios ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TUNER_TWIN_WORKERS", "1")  # one core, and the load runs counted here, not in workers

from _harness import ground_truth, load_settings  # noqa: E402
from twin_hidden_truth import scenarios  # noqa: E402

import tuner.capacity.knee as knee_mod  # noqa: E402
import tuner.twin.predict as predict_mod  # noqa: E402
from tuner.knobs import Knobs  # noqa: E402
from tuner.twin.twin import Twin  # noqa: E402

NAMES = ("chat-rtx4090", "rag32k-h100", "strict-tpot-a100", "azure-trace-l40s")


class Counter:
    """Wraps `measure_run` in the knee search, counting every load run (the dropped short ones included),
    its requests and the runs too short to judge."""

    def __init__(self):
        self.runs = self.requests = self.short = 0
        self._real = knee_mod.measure_run

    def __call__(self, *a, **kw):
        m = self._real(*a, **kw)
        self.runs += 1
        self.requests += len(m.run.records)
        self.short += m.verdict.reason == "too_short"
        return m


def one(sc, screen: int, spans: float, precision: float) -> dict:
    workload, slo = sc.workload(), sc.slo()
    twin = Twin.build(sc.gpu, sc.model, workload, slo, load_settings(sc), seed=0)
    choices = {k: list(dict.fromkeys(sc.space.knobs[k].values)) for k in sc.space.knobs}
    counter = Counter()
    shipped = predict_mod.SCREEN
    predict_mod.SCREEN = replace(shipped, requests=screen, precision=precision, latency_spans=spans)
    knee_mod.measure_run = counter
    refine_s, real_rerank = [0.0], predict_mod.rerank

    def timed_rerank(*a, **kw):
        t = time.process_time()
        try:
            return real_rerank(*a, **kw)
        finally:
            refine_s[0] += time.process_time() - t

    predict_mod.rerank = timed_rerank
    try:
        t0 = time.process_time()
        ranking = twin.rank(choices, lambda k: sc.space.allows(k, {}) is None, extra=[Knobs()])
        cpu = time.process_time() - t0
    finally:
        knee_mod.measure_run, predict_mod.rerank, predict_mod.SCREEN = counter._real, real_rerank, shipped
    top = [p.key for p in ranking.predictions if p.capacity_rps][:5]
    gt = ground_truth(sc)   # the truth's grid (cached by twin_hidden_truth.py), for what the ranking is worth
    best = gt["__grid_optimum__"]["cap"]
    true = [gt.get(k, {}).get("cap", 0.0) / best for k in top]
    return {"configs": len(ranking.predictions), "wall": ranking.wall_s, "cpu": cpu, "refine": refine_s[0], "runs": counter.runs,
            "short": counter.short, "top": top[0] if top else None, "top5": set(top),
            "best": ranking.predictions[0].capacity_rps,
            "true1": true[0] if true else 0.0, "true5": max(true, default=0.0)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--screens", type=int, nargs="+", default=[300, 600])
    ap.add_argument("--spans", type=float, nargs="+", default=[predict_mod.SCREEN.latency_spans],
                    help="the screen's minimum window in p99 E2E latencies (the full rule: 3)")
    ap.add_argument("--precision", type=float, nargs="+", default=[0.10], help="the screen's bracket")
    ap.add_argument("--scenarios", nargs="+", default=list(NAMES))
    a = ap.parse_args(argv)
    print(f"{'scenario':28} {'screen':>6} {'spans':>5} {'prec':>4} {'configs':>7} {'wall s':>7} {'cpu s':>6} {'refine':>6} {'runs':>6} "
          f"{'short':>5}  best (req/s)  truth of top-1, best of top-5  top-1 / top-5 as the first row")
    for sc in scenarios(a.scenarios):
        first = None
        for screen, spans, prec in [(n, x, q) for n in a.screens for x in a.spans for q in a.precision]:
            r = one(sc, screen, spans, prec)
            first = first or r
            same = f"{'same' if r['top'] == first['top'] else 'DIFFERENT'} / {len(r['top5'] & first['top5'])} of 5"
            print(f"{sc.name:28} {screen:6d} {spans:5.1f} {prec:4.2f} {r['configs']:7d} {r['wall']:7.1f} {r['cpu']:6.1f} {r['refine']:6.1f} "
                  f"{r['runs']:6d} {r['short']:5d}  {r['best']:.3f}        {r['true1']:6.1%} {r['true5']:6.1%}  {same}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
