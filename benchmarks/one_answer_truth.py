"""The careful truth behind `one_answer.py`'s studies: each answer's regret and whether it is in the true tied set.

Every configuration the seeded studies recommended or ended their search on, and vLLM's defaults, measured
by the same rule the studies decide with (`tuner.capacity.windows`: the highest passing rate of a shared
grid on each window, the study's run size), on many more windows, drawn from a seed no study used
(`--windows`, default 40). That is the truth the studies' answers are scored against:

- a configuration's true capacity: the geometric mean over the truth's windows, with its 95% interval;
- the true best: the highest; the true tied set: the configurations the truth cannot show to be more than
  the floor below the true best (the upper end of the paired difference's 95% interval is within the
  floor: a difference the truth's own windows cannot tell from the floor is a tie at the floor);
- each study's regret: the true best's capacity over its answer's, less one.

Configurations run two at a time (one process each) on a 2-core host.

    python benchmarks/one_answer.py --json rows.json ...
    python benchmarks/one_answer_truth.py rows.json [--windows 40] [--floor 0.05]
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from one_answer import SCENARIOS  # noqa: E402

TRUTH_SEED = 1_000_003  # no study's --seed: its windows are none of theirs


def _arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def measure(scenario: str, knobs: dict, windows: int, start: float) -> tuple[str, list[float | None]]:
    from tuner.capacity.knee import KneeSettings
    from tuner.capacity.measure import LoadSettings
    from tuner.capacity.windows import measure_windows, plan_for
    from tuner.engine.sim import SimEngine
    from tuner.failures import LaunchFailure
    from tuner.knobs import Knobs
    from tuner.slo import load_slo
    from tuner.workload.loader import load_workload

    args = SCENARIOS[scenario][1]
    wl, slo = load_workload(ROOT / _arg(args, "--workload")), load_slo(ROOT / _arg(args, "--slo"))
    engine = SimEngine(_arg(args, "--gpu"), _arg(args, "--model"), token_times=slo.needs_token_times)
    try:
        server = engine.launch(Knobs.stored(knobs))
    except LaunchFailure:
        return json.dumps(knobs, sort_keys=True), []
    ws, _ = measure_windows(server, wl, slo, LoadSettings(requests=1000, seed=0), plan_for(TRUTH_SEED, windows),
                            start, knee=KneeSettings(), max_num_seqs=server.cfg.max_num_seqs)
    return json.dumps(knobs, sort_keys=True), [w.capacity_rps for w in ws]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", type=Path)
    ap.add_argument("--windows", type=int, default=40)
    ap.add_argument("--floor", type=float, default=0.05)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    print(truth_report(json.loads(a.rows.read_text()), a.windows, a.floor, a.jobs))


def truth_report(rows: list[dict], windows: int, floor: float, jobs: int) -> str:
    """The truth's tables for `one_answer.py`'s rows (see the module docstring)."""
    from tuner.capacity.paired import capacity, paired_ratio
    from tuner.storage.records import WindowCapacity

    class A:
        pass
    a = A()
    a.windows, a.floor, a.jobs = windows, floor, jobs
    rows = [r for r in rows if "kind" in r]
    out = []
    for sc in dict.fromkeys(r["scenario"] for r in rows):
        mine = [r for r in rows if r["scenario"] == sc]
        configs = {json.dumps({}, sort_keys=True): {}}
        for r in mine:
            for k in (r["knobs"], r["best_knobs"] or {}):
                configs.setdefault(json.dumps(k, sort_keys=True), k)
        start = next((r["defaults"] for r in mine if r.get("defaults")), 5.0)
        with ProcessPoolExecutor(a.jobs) as pool:
            got = dict(pool.map(measure, [sc] * len(configs), list(configs.values()), [a.windows] * len(configs),
                                [start] * len(configs)))
        wins = {k: [WindowCapacity(seed=i, capacity_rps=c) for i, c in enumerate(v)] for k, v in got.items()}
        caps = {k: capacity(w) for k, w in wins.items()}
        best = max((k for k in caps if caps[k]), key=lambda k: caps[k].rps)
        tied = set()
        for k in caps:
            if not caps[k]:
                continue
            d = paired_ratio(wins[k], wins[best])
            if k == best or d is None or d.high >= -a.floor:
                tied.add(k)
        out += [f"**{sc}** (truth: {a.windows} windows each, seed {TRUTH_SEED}):", "",
                "| configuration | true capacity [95%] | vs the true best (paired) | in the true tied set |",
                "|---|---|---|---|"]
        for k in sorted(caps, key=lambda k: -(caps[k].rps if caps[k] else 0)):
            c = caps[k]
            d = paired_ratio(wins[k], wins[best])
            name = " ".join(f"{n}={v}" for n, v in configs[k].items()) or "vLLM's defaults"
            out.append(f"| {name} | {f'{c.rps:.2f} [{c.low:.2f}, {c.high:.2f}]' if c else 'none'} | "
                       f"{d.text() if d and k != best else '(the best)'} | {'yes' if k in tied else 'no'} |")
        out += ["", "| seed | answer | regret | in the true tied set |", "|---|---|---|---|"]
        ok = 0
        for r in sorted(mine, key=lambda r: r["seed"]):
            k = json.dumps(r["knobs"], sort_keys=True)
            regret = caps[best].rps / caps[k].rps - 1 if caps.get(k) else None
            ok += k in tied
            out.append(f"| {r['seed']} | {' '.join(f'{n}={v}' for n, v in r['knobs'].items()) or 'defaults'} | "
                       f"{'n/a' if regret is None else f'{100 * regret:.1f}%'} | {'yes' if k in tied else 'no'} |")
        out += ["", f"In the true tied set: {ok} of {len(mine)}.", ""]
    return "\n".join(out)


if __name__ == "__main__":
    main()
