"""How much faster than real time the simulator runs a saturated chat workload.

10,000 requests (~512 prompt / ~256 output tokens, log-normal), Qwen2.5-7B-Instruct on an RTX 4090 with
vLLM's defaults, Poisson arrivals above the engine's capacity (saturation), pinned to one core.
Target (issue 2): at least 100x real time. Run: python benchmarks/sim_speed.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from tuner.knobs import Knobs
from tuner.profiles.gpus import get_gpu
from tuner.profiles.models import get_model
from tuner.sim.config import resolve
from tuner.engine.virtual import SimRequest, run_virtual


def chat_requests(n: int, rate: float, seed: int = 0) -> list[SimRequest]:
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1 / rate, n))
    pin = np.clip(rng.lognormal(np.log(512) - 0.125, 0.5, n), 16, 8000).astype(int)
    pout = np.clip(rng.lognormal(np.log(256) - 0.125, 0.5, n), 2, 4000).astype(int)
    return [SimRequest(float(a), int(p), int(o)) for a, p, o in zip(arr, pin, pout)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=12.0, help="req/s offered (above capacity)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    cfg = resolve(get_gpu("rtx4090"), get_model("qwen2.5-7b"), Knobs())
    reqs = chat_requests(args.requests, args.rate)
    ratios, walls = [], []
    for _ in range(args.repeat):
        t = time.perf_counter()
        run = run_virtual(cfg, reqs)
        wall = time.perf_counter() - t
        walls.append(wall)
        ratios.append(run.duration_s / wall)
    served = sum(r.output_tokens for r in run.records) / run.duration_s
    print(f"requests           {args.requests}")
    print(f"offered rate       {args.rate} req/s (served {len(reqs) / run.duration_s:.2f} req/s, "
          f"{served:.0f} output tok/s: saturated)")
    print(f"engine steps       {run.steps}")
    print(f"simulated time     {run.duration_s:.0f} s")
    print(f"wall time (median) {statistics.median(walls):.2f} s over {args.repeat} runs, one core")
    print(f"speed-up (median)  {statistics.median(ratios):.0f}x real time  (target >= 100x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
