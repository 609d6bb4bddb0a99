"""The twin's whole-space ranking: its time, and its agreement with the reference ranking.

The ranking (`tuner.twin.predict.rank_space`: every configuration screened, the best `REFINE` predicted
carefully) runs on the simulator's fast paths: plain decode steps in a row (`tuner.sim.fused.decode_steps`) and
independent predictions side by side on the usable cores (`tuner.twin.workers`). Both are meant to change
no number. For each scenario (benchmarks/_scenarios.py, the twin at its nominal parameters, as before its
first fit) this ranks the space on the reference path (one `step` call a step, one process) and on the
shipped one, and prints each one's CPU seconds (this process and its workers) and wall seconds, and how
the shipped ranking agrees with the reference: the top-1, the top-3, and whether every prediction is
identical. The shipped screen runs in `GRID_CHAINS` chains, cut where a screen ignores its start rate
(`tuner.twin.predict._chains`), each raced at its own bar: the reference path runs the same chains one after
another in one process, so the two must agree to the last digit.

Run alone (its timings are of this host's cores; the CPU column is comparable across a busy host):
    python benchmarks/twin_rank_exact.py [--scenarios ...]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import load_settings  # noqa: E402
from _scenarios import SCENARIOS  # noqa: E402

import tuner.engine.virtual as virtual  # noqa: E402
from tuner.knobs import Knobs  # noqa: E402
from tuner.twin.twin import Twin  # noqa: E402


def _cpu() -> float:
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def rank(sc, *, reference: bool) -> dict:
    workload, slo = sc.workload(), sc.slo()
    twin = Twin.build(sc.gpu, sc.model, workload, slo, load_settings(sc), seed=0)
    choices = {k: list(dict.fromkeys(sc.space.knobs[k].values)) for k in sc.space.knobs}
    saved = virtual.FUSED_DECODE, os.environ.get("TUNER_TWIN_WORKERS")
    virtual.FUSED_DECODE = not reference
    if reference:
        os.environ["TUNER_TWIN_WORKERS"] = "1"
    try:
        c0, w0 = _cpu(), time.perf_counter()
        ranking = twin.rank(choices, lambda k: sc.space.allows(k, {}) is None, extra=[Knobs()])
        cpu, wall = _cpu() - c0, time.perf_counter() - w0
    finally:
        virtual.FUSED_DECODE = saved[0]
        if saved[1] is None:
            os.environ.pop("TUNER_TWIN_WORKERS", None)
        else:
            os.environ["TUNER_TWIN_WORKERS"] = saved[1]
    preds = [(p.key, p.capacity_rps) for p in ranking.predictions]
    return {"cpu": cpu, "wall": wall, "keys": [k for k, c in preds if c], "preds": preds}


def agreement(ref: dict, other: dict) -> str:
    same1 = "same" if ref["keys"][:1] == other["keys"][:1] else "DIFFERENT"
    top3 = len(set(ref["keys"][:3]) & set(other["keys"][:3]))
    return f"top-1 {same1}, top-3 {top3}/3, {'identical' if ref['preds'] == other['preds'] else 'numbers differ'}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", nargs="+", default=[s.name for s in SCENARIOS])
    a = ap.parse_args(argv)
    print(f"{'scenario':18} {'configs':>7}  {'reference cpu/wall s':>20}  {'shipped cpu/wall s':>18}  agreement")
    for sc in [s for s in SCENARIOS if s.name in a.scenarios]:
        ref, new = rank(sc, reference=True), rank(sc, reference=False)
        print(f"{sc.name:18} {len(ref['preds']):7d}  {ref['cpu']:9.1f} / {ref['wall']:6.1f}  "
              f"{new['cpu']:8.1f} / {new['wall']:6.1f}  {agreement(ref, new)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
