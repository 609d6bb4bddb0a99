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

from tuner.fleet.compare import compare
from tuner.fleet.load import SESSION_KEYS
from tuner.fleet.measure import FleetSetup
from tuner.knobs import Knobs
from tuner.profiles.gpus import get_gpu
from tuner.profiles.models import get_model
from tuner.sim.config import resolve
from tuner.slo import load_slo
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
    setup = FleetSetup(cfg=resolve(get_gpu(GPU), get_model(MODEL), Knobs()), slo=slo, workload=wl, peak=a.rate, seed=1,
                       session=a.session_key)
    out = []
    for policy in a.policy or ["round_robin", "cache_aware"]:
        c = compare(setup, GPU, MODEL, Knobs(), a.replicas, policy, duration_s=a.duration, time_scale=a.time_scale,
                    warmup_s=a.warmup, run_dir=tempfile.mkdtemp(prefix="fleet-bench-"),
                    scale_out=not a.no_scale_out, prometheus=a.prometheus)
        row = {"workload": a.workload, "session_key": a.session_key, **c.model_dump(),
               "diff_attainment": c.diff_attainment, "diff_p99_ttft": c.diff_p99_ttft}
        out.append(row)
        print(json.dumps(row, default=lambda x: round(x, 4) if isinstance(x, float) else x))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
