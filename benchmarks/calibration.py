"""Re-simulate published vLLM measurements on real GPUs and compare (docs/calibration.md).

Each case uses its own setup: model, GPU, the vLLM version's defaults for unset knobs, and the
workload's request count and mean lengths (ShareGPT runs stop at EOS, so output lengths are drawn to
match the published output tokens per request). Run: python benchmarks/calibration.py [--markdown]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

from tuner.knobs import Knobs
from tuner.profiles.gpus import get_gpu
from tuner.profiles.models import get_model
from tuner.sim.config import resolve
from tuner.engine.virtual import SimRequest, run_virtual


def sharegpt_like(n: int, mean_in: float, mean_out: float, seed: int, rate: float | None):
    """Log-normal lengths (sigma 0.9, clipped as vLLM bench serve filters ShareGPT: prompt <= 1024)
    rescaled to the published means; all at t=0 for rate inf, else Poisson arrivals."""
    rng = np.random.default_rng(seed)
    pin = np.clip(rng.lognormal(0, 0.9, n), 0.02, None)
    pout = np.clip(rng.lognormal(0, 0.9, n), 0.01, None)
    pin = np.clip(np.round(pin / pin.mean() * mean_in), 4, 1024).astype(int)
    pout = np.clip(np.round(pout / pout.mean() * mean_out), 1, 1024).astype(int)
    arr = np.zeros(n) if rate is None else np.cumsum(rng.exponential(1 / rate, n))
    return [SimRequest(float(a), int(p), int(o)) for a, p, o in zip(arr, pin, pout)]


def fixed(n: int, inp: int, out: int):
    return [SimRequest(0.0, inp, out) for _ in range(n)]


# (label, source, model, gpu, knobs as that vLLM version defaulted, requests, {metric: published})
CASES = [
    ("Llama-3.1-8B, A100-80GB, ShareGPT Poisson 4 req/s (vLLM 0.6.0)",
     "sgl-project/sglang benchmark/benchmark_vllm_060/README.md",
     "llama-3.1-8b", "a100", Knobs(max_model_len=4096, gpu_memory_utilization=0.9, max_num_seqs=256,
                                   max_num_batched_tokens=4096),
     lambda: sharegpt_like(1200, 215, 194, 1, 4.0), {"median_ttft_ms": 100.48, "median_tpot_ms": 14.14}),
    ("Llama-3.1-8B, A100-80GB, ShareGPT Poisson 8 req/s (vLLM 0.6.0)",
     "sgl-project/sglang benchmark/benchmark_vllm_060/README.md",
     "llama-3.1-8b", "a100", Knobs(max_model_len=4096, gpu_memory_utilization=0.9, max_num_seqs=256,
                                   max_num_batched_tokens=4096),
     lambda: sharegpt_like(2400, 215, 194, 2, 8.0), {"median_ttft_ms": 120.39, "median_tpot_ms": 17.09}),
    ("Llama-3.1-8B, A100-80GB, ShareGPT offline 5000 prompts (vLLM 0.6.0)",
     "sgl-project/sglang benchmark/benchmark_vllm_060/README.md",
     "llama-3.1-8b", "a100", Knobs(max_model_len=4096, gpu_memory_utilization=0.9, max_num_seqs=256,
                                   max_num_batched_tokens=4096),
     lambda: sharegpt_like(5000, 215, 194, 3, None), {"req_per_s": 21.27, "out_tok_per_s": 4132}),
    ("Llama-3.1-70B, 4x H100 (TP 4), ShareGPT offline 5000 prompts (vLLM 0.6.0)",
     "sgl-project/sglang benchmark/benchmark_vllm_060/README.md",
     "meta-llama/Llama-3.1-70B-Instruct", "h100",
     Knobs(tensor_parallel_size=4, max_model_len=4096, gpu_memory_utilization=0.9, max_num_seqs=256,
           max_num_batched_tokens=4096),
     lambda: sharegpt_like(5000, 215, 194, 7, None), {"req_per_s": 19.04, "out_tok_per_s": 3701}),
    ("Llama-3-8B, H100-SXM, 320 ShareGPT prompts, rate inf (vLLM 0.5.4)",
     "LambdaLabsML/vllm-benchmark",
     "llama-3-8b", "h100", Knobs(max_model_len=2048, gpu_memory_utilization=0.95, max_num_seqs=256,
                                 max_num_batched_tokens=2048),
     lambda: sharegpt_like(320, 215, 204, 4, None), {"req_per_s": 29.52, "out_tok_per_s": 6027,
                                                     "median_tpot_ms": 20.0}),
    ("Llama-3-8B, A100-SXM-80GB, 320 ShareGPT prompts, rate inf (vLLM 0.5.4)",
     "LambdaLabsML/vllm-benchmark",
     "llama-3-8b", "a100", Knobs(max_model_len=2048, gpu_memory_utilization=0.95, max_num_seqs=256,
                                 max_num_batched_tokens=2048),
     lambda: sharegpt_like(320, 215, 204, 5, None), {"req_per_s": 15.21, "out_tok_per_s": 3107,
                                                     "median_tpot_ms": 40.9}),
    ("Qwen3-14B, H100-SXM, ShareGPT 1000 prompts, rate inf (vLLM 0.11.0)",
     "gpustack docs/performance-lab/qwen3-14b/h100.md",
     "qwen3-14b", "h100", Knobs(gpu_memory_utilization=0.9),
     lambda: sharegpt_like(1000, 215, 202, 6, None), {"req_per_s": 15.74, "out_tok_per_s": 3174}),
    ("Qwen3-14B, H100-SXM, random 4000 in / 200 out, rate inf (vLLM 0.11.0)",
     "gpustack docs/performance-lab/qwen3-14b/h100.md",
     "qwen3-14b", "h100", Knobs(gpu_memory_utilization=0.9), lambda: fixed(500, 4000, 200),
     {"req_per_s": 2.20}),
    ("Qwen3-14B, H100-SXM, random 2000 in / 100 out, rate inf (vLLM 0.11.0)",
     "gpustack docs/performance-lab/qwen3-14b/h100.md",
     "qwen3-14b", "h100", Knobs(gpu_memory_utilization=0.9), lambda: fixed(500, 2000, 100),
     {"req_per_s": 5.06}),
    ("Qwen3-14B, H100-SXM, random 32000 in / 100 out, rate inf (vLLM 0.11.0)",
     "gpustack docs/performance-lab/qwen3-14b/h100.md",
     "qwen3-14b", "h100", Knobs(gpu_memory_utilization=0.9, max_model_len=32768),
     lambda: fixed(100, 32000, 100), {"req_per_s": 0.26}),
]


def measure(model: str, gpu: str, knobs: Knobs, requests) -> dict[str, float]:
    cfg = resolve(get_gpu(gpu), get_model(model), knobs)
    run = run_virtual(cfg, requests, token_times=False)
    recs = run.records
    dur = max(r.finish_s for r in recs) - min(r.sent_s for r in recs)
    return {
        "req_per_s": len(recs) / dur,
        "out_tok_per_s": sum(r.output_tokens for r in recs) / dur,
        "median_ttft_ms": statistics.median(r.ttft for r in recs) * 1e3,
        "median_tpot_ms": statistics.median(r.tpot for r in recs if r.output_tokens > 1) * 1e3,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--markdown", action="store_true", help="print the docs/calibration.md table")
    args = ap.parse_args(argv)
    rows = []
    for label, source, model, gpu, knobs, make, published in CASES:
        sim = measure(model, gpu, knobs, make())
        for metric, pub in published.items():
            rows.append((label, source, metric, pub, sim[metric], sim[metric] / pub - 1))
    if args.markdown:
        print("| case | source | metric | published | simulated | error |")
        print("|---|---|---|---:|---:|---:|")
        for label, source, metric, pub, s, err in rows:
            print(f"| {label} | {source} | {metric} | {pub:g} | {s:.4g} | {err:+.0%} |")
    else:
        for label, source, metric, pub, s, err in rows:
            print(f"{label[:70]:70s} {metric:15s} pub {pub:9.2f} sim {s:9.2f} {err:+6.0%}")
    within = sum(abs(r[5]) <= 0.25 for r in rows)
    print(f"\n{within}/{len(rows)} comparisons within +/-25%", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
