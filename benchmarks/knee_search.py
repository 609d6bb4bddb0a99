"""Load runs needed to measure one configuration's capacity: ours against the peers' rate searches.

- ours: badness-interpolated bracketing with noise-aware re-measurement (tuner/capacity/knee.py);
- doubling + bisection (vLLM `bench sweep serve_sla`): double the rate from the start until the SLO
  fails, then bisect until the bracket is within the precision;
- step-down (vLLM `auto_tune.sh`): one run at rate inf, then from int(throughput) + 1 down 1 req/s at a
  time until the SLO holds (its precision is 1 req/s, whatever the capacity).

All three start from the same rate and use the same pass/fail rule (`tuner.capacity.verdict`), on every
benchmark scenario's vLLM-default and FP8-KV configuration, with simulator noise on, over several seeds.
The peers send each load run's whole fixed-length schedule; ours stops a run as soon as its sequential
test decides. Printed: median load runs, median engine-seconds (the GPU time the runs take), and the
median error of the capacity found against the noise-free truth (our knee search without noise at 1%
precision, so the truth does not move with the search under test). Targets: ours needs at most half the
load runs (issue 7) and at most half the engine-seconds (issues 11, 36) of doubling + bisection at equal
or better error.

Run: python benchmarks/knee_search.py [--seeds 5] [--quick]   (`main(argv)` for benchmarks/run_all.py)
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
import statistics
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import NOISE, load_settings  # noqa: E402
from _scenarios import SCENARIOS  # noqa: E402

from tuner.engine.sim import SimEngine  # noqa: E402
from tuner.knobs import Knobs  # noqa: E402
from tuner.capacity.knee import KneeSettings, find_capacity  # noqa: E402
from tuner.capacity.measure import measure  # noqa: E402

PRECISION = 0.05
TRUTH_PRECISION = 0.01
START = 1.0


def careful_truth(sc, knobs: Knobs, workload, slo) -> float:
    """The noise-free engine's capacity at 1% precision, on the same request sample as the searches."""
    server = SimEngine(sc.gpu, sc.model, cost_params=sc.truth, token_times="itl" in slo.thresholds).launch(knobs)
    r = find_capacity(server, workload, slo, start_rate=START, load=load_settings(sc),
                      knee=KneeSettings(precision=TRUTH_PRECISION, virtual_burst=True),
                      max_num_seqs=server.cfg.max_num_seqs)
    return r.capacity or 0.0


class Counter:
    def __init__(self, server, workload, slo, load):
        self.server, self.workload, self.slo, self.load = server, workload, slo, load
        self.runs = 0
        self.engine_s = 0.0

    def passes(self, rate: float) -> tuple[bool, float | None]:
        """The peers' load run: the whole fixed-length schedule (no sequential stop), the same verdict."""
        self.runs += 1
        m, run = measure(self.server, self.workload, self.slo, rate, self.load, seed=self.load.seed,
                         salt=self.runs, sequential=False)
        self.engine_s += run.duration_s
        return m.summary.passed, m.summary.throughput_rps


def doubling_bisection(c: Counter) -> float | None:
    lo, hi, rate = None, None, START
    while hi is None and rate < 1e4:
        ok, _ = c.passes(rate)
        if ok:
            lo, rate = rate, rate * 2
        else:
            hi = rate
    if lo is None:  # the start already fails: halve until it passes
        rate = START / 2
        while lo is None and rate > 0.01:
            ok, _ = c.passes(rate)
            if ok:
                lo = rate
            else:
                hi, rate = rate, rate / 2
    if lo is None or hi is None:
        return lo
    while hi / lo > 1 + PRECISION:
        mid = (lo + hi) / 2
        ok, _ = c.passes(mid)
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo


def step_down(c: Counter) -> float | None:
    ok, thr = c.passes(1e6)
    if ok:
        return thr
    rate = int(thr or 1) + 1
    while rate > 0:
        ok, _ = c.passes(float(rate))
        if ok:
            return float(rate)
        rate -= 1
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--quick", action="store_true",
                    help="2 seeds and no longer-run peer: a few minutes on 2 cores")
    ap.add_argument("--scenarios", default=",".join(s.name for s in SCENARIOS))
    ap.add_argument("--peer-lengths", default="1,4",
                    help="doubling + bisection is also run with its load runs this many times longer "
                         "(comma-separated): what its engine-seconds are at an error like ours")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.peer_lengths = 2, "1"
    t0 = time.perf_counter()
    out = {}
    lengths = [int(x) for x in args.peer_lengths.split(",") if x.strip() and int(x) > 1]
    longer = "".join(f"  {f'dbl x{k}':>10s} {'eng-s':>6s} {'err':>5s}" for k in lengths)
    print(f"{'scenario':18s} {'config':8s} {'truth':>7s}  {'ours runs':>9s} {'eng-s':>6s} {'err':>5s}  "
          f"{'dbl+bisect':>10s} {'eng-s':>6s} {'err':>5s}  {'step-down':>9s} {'eng-s':>6s} {'err':>5s}{longer}")
    all_ratio, eng_ratio, step_ratio = [], [], []
    errors: dict[str, list[float]] = {}
    long_ratio: dict[int, list[float]] = {k: [] for k in lengths}
    for sc in [s for s in SCENARIOS if s.name in args.scenarios.split(",")]:
        workload, slo = sc.workload(), sc.slo()
        for label, knobs in (("default", Knobs()), ("fp8-kv", Knobs(kv_cache_dtype="fp8"))):
            truth = careful_truth(sc, knobs, workload, slo)
            res = {"ours": [], "dbl": [], "step": [], **{f"dbl_x{k}": [] for k in lengths}}
            for seed in range(args.seeds):
                eng = SimEngine(sc.gpu, sc.model, noise=NOISE, token_times="itl" in slo.thresholds,
                                launch_seed=lambda k, s=seed: zlib.crc32(f"{s}:{k.key()}".encode()))
                load = load_settings(sc, seed)
                srv = eng.launch(knobs)
                # no warm-up here: the peers' searches have none either
                # the burst a real-time search sends (`KneeSettings.virtual_burst`): this stands in for one
                r = find_capacity(srv, workload, slo, start_rate=START,
                                  load=replace(load, warmup_requests=0),
                                  knee=KneeSettings(precision=PRECISION, virtual_burst=True),
                                  max_num_seqs=srv.cfg.max_num_seqs)
                res["ours"].append((r.runs, r.capacity, r.engine_s))
                for name, fn in (("dbl", doubling_bisection), ("step", step_down)):
                    c = Counter(eng.launch(knobs), workload, slo, load)
                    cap = fn(c)
                    res[name].append((c.runs, cap, c.engine_s))
                for k in lengths:  # the same peer with k times the requests in every load run
                    c = Counter(eng.launch(knobs), workload, slo, replace(load, requests=load.requests * k))
                    cap = doubling_bisection(c)
                    res[f"dbl_x{k}"].append((c.runs, cap, c.engine_s))
            row = {}
            for name, vals in res.items():
                runs = statistics.median(v[0] for v in vals)
                err = statistics.median(abs((v[1] or 0) / truth - 1) for v in vals) if truth else float("nan")
                eng_s = statistics.median(v[2] for v in vals)
                row[name] = {"runs_median": runs, "error_median": err, "engine_s_median": eng_s, "all": vals}
                if truth:
                    errors.setdefault(name, []).extend(abs((v[1] or 0) / truth - 1) for v in vals)
            all_ratio.append(row["ours"]["runs_median"] / row["dbl"]["runs_median"])
            eng_ratio.append(row["ours"]["engine_s_median"] / row["dbl"]["engine_s_median"])
            step_ratio.append(row["ours"]["engine_s_median"] / row["step"]["engine_s_median"])
            for k in lengths:
                long_ratio[k].append(row["ours"]["engine_s_median"] / row[f"dbl_x{k}"]["engine_s_median"])
            out[f"{sc.name}/{label}"] = {"truth": truth, **row}
            o, d, st = row["ours"], row["dbl"], row["step"]
            more = "".join(f"  {row[f'dbl_x{k}']['runs_median']:10.1f} {row[f'dbl_x{k}']['engine_s_median']:6.0f} "
                           f"{row[f'dbl_x{k}']['error_median']:5.1%}" for k in lengths)
            print(f"{sc.name:18s} {label:8s} {truth:7.2f}  {o['runs_median']:9.1f} {o['engine_s_median']:6.0f} "
                  f"{o['error_median']:5.1%}  {d['runs_median']:10.1f} {d['engine_s_median']:6.0f} "
                  f"{d['error_median']:5.1%}  {st['runs_median']:9.1f} {st['engine_s_median']:6.0f} "
                  f"{st['error_median']:5.1%}{more}", flush=True)
    print(f"\nours / doubling+bisection load runs: median {statistics.median(all_ratio):.2f} "
          f"(target <= 0.5), worst {max(all_ratio):.2f}")
    print(f"ours / doubling+bisection engine-seconds: median {statistics.median(eng_ratio):.2f} "
          f"(target <= 0.5), worst {max(eng_ratio):.2f}")
    print(f"ours / step-down engine-seconds: median {statistics.median(step_ratio):.2f}, "
          f"worst {max(step_ratio):.2f}")
    for k in lengths:
        print(f"ours / doubling+bisection with {k}x longer runs, engine-seconds: median "
              f"{statistics.median(long_ratio[k]):.2f}, worst {max(long_ratio[k]):.2f}")
    names = {"ours": "ours", "dbl": "doubling+bisection", "step": "step-down",
             **{f"dbl_x{k}": f"doubling+bisection x{k}" for k in lengths}}
    print("error against the noise-free truth over every search (median, 90th percentile): " + "; ".join(
        f"{names[k]} {statistics.median(v):.1%}, {statistics.quantiles(v, n=10)[-1]:.1%}"
        for k, v in errors.items() if len(v) >= 2))
    print(f"({args.seeds} seeds, {time.perf_counter() - t0:.0f} s)")
    dest = Path(__file__).resolve().parent / "results"
    dest.mkdir(exist_ok=True)
    (dest / "knee_search.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
