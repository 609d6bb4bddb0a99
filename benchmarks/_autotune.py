"""vLLM's `benchmarks/auto_tune/auto_tune.sh` search, reimplemented faithfully on our engines.

1. Find the highest `--gpu-memory-utilization` that launches: 0.98, stepping down 0.01 (with the largest
   max-num-seqs and max-num-batched-tokens of the lists), each try a launch.
2. For every max-num-seqs x max-num-batched-tokens pair (in list order), launch and benchmark: first at
   request rate inf; if the latency limit holds there, that throughput is the result; else start at
   int(throughput) + 1 req/s and step the rate down 1 req/s at a time until it holds.
3. Keep the best. The script's single latency limit (p99 E2EL) is replaced by the scenario's SLO check so
   every strategy is judged on the same objective; the search procedure is the script's.
"""

from __future__ import annotations

from tuner.failures import LaunchFailure
from tuner.knobs import Knobs
from tuner.search.measure import measure
from tuner.search.runner import knobs_key

INF_RATE = 1e6  # every request at once, like --request-rate inf


def auto_tune(engine, sc, workload, slo, load, trace) -> None:
    seqs = sorted(sc.space.knobs["max_num_seqs"].values)
    tokens = sorted(sc.space.knobs["max_num_batched_tokens"].values)
    launches = runs = 0
    best: tuple[float, str] | None = None

    util = 0.98
    found = None
    while util >= 0.9 - 1e-9:
        launches += 1
        try:
            engine.launch(Knobs(gpu_memory_utilization=round(util, 2), max_num_seqs=seqs[-1],
                                max_num_batched_tokens=tokens[-1])).stop()
            found = round(util, 2)
            break
        except LaunchFailure:
            util -= 0.01
    if found is None:
        return
    for s in seqs:
        for t in tokens:
            if t < s:
                continue
            knobs = Knobs(gpu_memory_utilization=found, max_num_seqs=s, max_num_batched_tokens=t)
            launches += 1
            try:
                server = engine.launch(knobs)
            except LaunchFailure:
                trace.add(launches, runs, best[1] if best else None)
                continue
            with server:
                m, _ = measure(server, workload, slo, INF_RATE, load, seed=load.seed, max_num_seqs=s)
                runs += 1
                cap = None
                if m.summary.passed:
                    cap = m.summary.throughput_rps
                else:
                    rate = int(m.summary.throughput_rps or 1) + 1
                    while rate > 0:
                        m, _ = measure(server, workload, slo, float(rate), load, seed=load.seed,
                                       max_num_seqs=s)
                        runs += 1
                        if m.summary.passed:
                            cap = float(rate)
                            break
                        rate -= 1
            if cap and (best is None or cap > best[0]):
                best = (cap, knobs_key(knobs))
            trace.add(launches, runs, best[1] if best else None)
