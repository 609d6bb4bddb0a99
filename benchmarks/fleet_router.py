"""The router model against the real vLLM Router: the same load through both, numbers printed.

N HTTP-simulator replicas (`tune sim serve`, the tuned-free defaults of Qwen2.5-7B on an RTX 4090) behind
the real `vllm-router` with a policy, our replay client sending the chat workload at a rate; then the
virtual-time fleet (`tuner.fleet`) with the same replicas, policy, requests and arrival times. Printed per
policy: attainment, p99 TTFT and TPOT, each replica's share and prefix-cache hit rate, both ways, and the
relative differences (issue 39's bar: within 10% on attainment and p99 TTFT).

    PYTHONPATH=. python benchmarks/fleet_router.py --rate 15 --duration 60 --time-scale 3 \
        --policy round_robin --policy cache_aware
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from tuner.fleet.load import SESSION_KEYS, arrivals, draw, fleet_requests
from tuner.fleet.measure import FleetSetup, check, run_fleet
from tuner.fleet.real import run_real, start_fleet
from tuner.knobs import Knobs
from tuner.metrics.window import PREFIX_HITS, PREFIX_QUERIES, REQUEST_SUCCESS
from tuner.profiles.gpus import get_gpu
from tuner.profiles.models import get_model
from tuner.sim.config import resolve
from tuner.slo import load_slo, score
from tuner.workload.loader import load_workload

GPU, MODEL = "rtx4090", "qwen2.5-7b"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="workloads/chat.jsonl")
    ap.add_argument("--slo", default="workloads/chat.slo.yaml")
    ap.add_argument("--rate", type=float, default=15.0)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--time-scale", type=float, default=3.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--policy", action="append", default=[])
    ap.add_argument("--session-key", default="tenant", choices=SESSION_KEYS, help="what a request's session id "
                    "is (sent as X-Session-ID; the virtual fleet hashes the same): its tenant, its first "
                    "block (system prompt), or none")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-scale-out", action="store_true", help="replicas without --enable-scale-out: the "
                    "router's cache_aware gets no token ids (every decision `missing_tokens`)")
    ap.add_argument("--prometheus", default=None, help="read the replicas' metrics from this Prometheus (it "
                    "must scrape the replicas' ports; default: scrape each /metrics)")
    a = ap.parse_args()
    wl, slo = load_workload(a.workload), load_slo(a.slo)
    times = arrivals([(0.0, a.rate)], a.duration, seed=1)
    reqs = draw(wl, len(times), seed=1)
    setup = FleetSetup(cfg=resolve(get_gpu(GPU), get_model(MODEL), Knobs()), slo=slo, workload=wl, peak=a.rate, seed=1,
                       session=a.session_key)
    sessions = [f.key.session for f in fleet_requests(wl, times, seed=1, session=a.session_key, drawn=reqs)]
    out = []
    for policy in a.policy or ["round_robin", "cache_aware"]:
        vrun = run_fleet(setup, a.replicas, policy, [(0.0, a.rate)], a.duration)
        v = check(setup, vrun, a.replicas, policy, a.rate, warmup_s=a.warmup)
        t0 = time.time()
        with start_fleet(GPU, MODEL, Knobs(), a.replicas, policy, run_dir=tempfile.mkdtemp(prefix="fleet-bench-"),
                         time_scale=a.time_scale, scale_out=not a.no_scale_out) as fleet:
            real = run_real(fleet, reqs, times, offered_rate=a.rate, time_scale=a.time_scale,
                            prometheus=a.prometheus, sessions=sessions)
            router_decisions = fleet.router_decisions()
        wall = time.time() - t0
        for r in real.run.records:
            r.in_window = r.scheduled_s >= a.warmup
        s = score(real.run.records, slo)
        shares = [m.counters.get(REQUEST_SUCCESS, 0.0) if m else None for m in real.replica_metrics]
        hits = [(m.counters.get(PREFIX_HITS, 0.0) / m.counters[PREFIX_QUERIES]) if m and m.counters.get(PREFIX_QUERIES)
                else None for m in real.replica_metrics]
        row = {"policy": policy, "workload": a.workload, "session_key": a.session_key, "rate": a.rate, "replicas": a.replicas, "requests": len(times), "wall_s": round(wall, 1),
               "real": {"attainment": s.attainment, "p99_ttft_ms": s.metrics["ttft"].p99_ms,
                        "p99_tpot_ms": s.metrics["tpot"].p99_ms, "served_per_replica": shares,
                        "hit_rate_per_replica": hits, "errors": s.errors, "warnings": real.run.warnings[:3],
                        "router_decisions": router_decisions},
               "virtual": {"attainment": v.attainment, "p99_ttft_ms": v.p99_ttft_ms, "p99_tpot_ms": v.p99_tpot_ms,
                           "served_per_replica": [r.routed for r in v.per_replica],
                           "hit_rate_per_replica": [r.prefix_hit_rate for r in v.per_replica], "errors": v.errors,
                           "decisions": v.decisions}}
        rv, vv = row["real"], row["virtual"]
        row["diff_attainment"] = abs(rv["attainment"] - vv["attainment"]) / max(vv["attainment"], 1e-9)
        row["diff_p99_ttft"] = (abs(rv["p99_ttft_ms"] - vv["p99_ttft_ms"]) / vv["p99_ttft_ms"]
                                if rv["p99_ttft_ms"] and vv["p99_ttft_ms"] else None)
        out.append(row)
        print(json.dumps(row, default=lambda x: round(x, 4) if isinstance(x, float) else x))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
