"""The simulator against every published vLLM measurement of the calibration set, per kind of figure (issue 61).

The set is `benchmarks/data/calibration_published.yaml` (each run with its source, a verbatim quote, the vLLM
version, model, GPU, flags and workload) plus the older cases of `benchmarks/calibration.py`. Each run is
re-simulated in virtual time with its own setup: the workload as the source's client made it (ShareGPT-like
log-normal lengths rescaled to the run's published means, or the random dataset's fixed lengths), its arrival
process (all at once, Poisson at the rate, or a closed loop of `max_concurrency`), and the batch defaults of
the vLLM version it ran (`version_knobs`). A run whose model or GPU has no profile, or whose dtype the
simulator does not model, is listed as skipped with the reason, never silently dropped.

A fixed part of the set is held out (`held_out`: by a hash of the run's id, about 30%): a fit of the cost
model's parameters may look only at the rest, and both parts are reported apart (issue 61's rule).

What a re-simulation takes from the run (no figure is tuned per run or per source): its checkpoint (an
FP8 or AWQ one is the model profile's quantized entry), its multi-step flag (`tuner.sim.multistep`), and
prompts that hash their own blocks (vLLM
hashes every full prompt block, so a request preempted for recompute finds its own computed blocks in the
prefix cache until they are evicted; prompts of the set share no prefix).

Run: python benchmarks/calibration_set.py [--markdown] [--only ID ...]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import zlib
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from calibration import CASES  # noqa: E402

from tuner.engine.virtual import SimRequest, run_virtual  # noqa: E402
from tuner.errors import UserError  # noqa: E402
from tuner.failures import LaunchFailure  # noqa: E402
from tuner.knobs import Knobs, vllm_batch_defaults  # noqa: E402
from tuner.profiles.gpus import get_gpu  # noqa: E402
from tuner.profiles.models import get_model  # noqa: E402
from tuner.sim.config import resolve  # noqa: E402
from tuner.sim.costs import CostParams  # noqa: E402
from tuner.sim.engine import EngineCore  # noqa: E402

DATA = HERE / "data" / "calibration_published.yaml"
#: ShareGPT through `vllm bench serve` (REFERENCE.md section 6): about 200 input / 190 output tokens a request
SHAREGPT_MEANS = (215.0, 194.0)
KINDS = {"req_per_s": "throughput", "output_tok_per_s": "throughput", "total_tok_per_s": "throughput",
         "mean_tpot_ms": "TPOT/ITL", "median_tpot_ms": "TPOT/ITL", "p99_tpot_ms": "TPOT/ITL",
         "mean_itl_ms": "TPOT/ITL", "median_itl_ms": "TPOT/ITL", "p99_itl_ms": "TPOT/ITL",
         "mean_ttft_ms": "TTFT mean/median", "median_ttft_ms": "TTFT mean/median", "p99_ttft_ms": "TTFT p99",
         "median_e2el_ms": "latency", "duration_s": "latency"}
#: weights the simulator models, by the set's `dtype` wording (its first word): 16-bit, FP8, AWQ int4
WEIGHTS = {"bf16": None, "fp16": None, "fp8": "fp8", "awq-int4": "awq"}
#: a base checkpoint has its Instruct sibling's config.json (same layers, widths and vocabulary)
SAME_CONFIG = {"meta-llama/Llama-3.1-8B": "meta-llama/Llama-3.1-8B-Instruct"}
#: `--gpu-memory-utilization`'s default before the 0.92 of the 0.32 source is 0.9 (REFERENCE.md section 3),
#: but at 0.9 nine runs of the set that did launch (Qwen3-32B on one A100 or H100, Qwen3-8B on an RTX 4090,
#: each at the default max_model_len 40960) leave the simulator less KV than one such request needs: the
#: simulator's activation and non-torch reserve reads high for those versions, or the sources raised the
#: fraction. The set keeps the simulator's own default (0.92) for every version rather than drop them.
OLD_UTILIZATION = None
BLOCK = 16
#: flags a source states for every run it published (REFERENCE.md section 6): the SGLang repository's vLLM
#: 0.6.0 runs used multi-step scheduling
SOURCE_FLAGS = {"sgl-project/sglang benchmark/benchmark_vllm_060/README.md": {"num_scheduler_steps": 10}}


def held_out(run_id: str) -> bool:
    """About 30% of the runs, fixed by their ids: never looked at by a fit."""
    return zlib.crc32(run_id.encode()) % 10 < 3


def _version(v: str | None) -> tuple[int, int]:
    parts = [int(x) for x in str(v or "0.32").split(".")[:2] if x.isdigit()]
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


def version_knobs(version: str | None, gpu, flags: dict, gpus: int) -> Knobs:
    """The run's flags, and the defaults of the vLLM it ran: V0 (before 0.8) took 256 sequences and,
    without chunked prefill, a whole prompt a step (`max_num_batched_tokens` = the context); V1 took
    `EngineArgs.get_batch_defaults` (the simulator's `vllm_batch_defaults`). Versions before 0.32 took
    0.9 of the GPU's memory."""
    known = {k: v for k, v in flags.items() if k in Knobs.model_fields}
    if gpus > 1:
        known["tensor_parallel_size"] = gpus
    if _version(version) < (0, 32) and OLD_UTILIZATION:
        known.setdefault("gpu_memory_utilization", OLD_UTILIZATION)
    if _version(version) < (0, 8):
        known.setdefault("max_num_seqs", 256)
        known.setdefault("max_num_batched_tokens", max(int(known.get("max_model_len") or 4096), 2048))
    else:
        seqs, tokens = vllm_batch_defaults(gpu)
        known.setdefault("max_num_seqs", seqs)
        known.setdefault("max_num_batched_tokens", tokens)
    return Knobs(**known)


def checkpoint(run: dict) -> tuple[str, dict]:
    """The model profile the run served and the flags its weights imply: the set names a quantized
    checkpoint by its repository (Qwen/Qwen3-14B-FP8) or by the base and a dtype ('fp8 (dynamic W8A8)')."""
    dtype = str(run.get("dtype") or "bf16").split()[0].rstrip(",")
    if dtype not in WEIGHTS:
        raise ValueError(f"dtype {run.get('dtype')} is not modelled")
    name = str(run["model"]).split(" ")[0]
    name = SAME_CONFIG.get(name, name)
    quant = WEIGHTS[dtype]
    suffix = {"fp8": "-FP8", "awq": "-AWQ"}.get(quant or "", "")
    if suffix and not name.endswith(suffix):
        name += suffix
    return name, {}


def prompt_hashes(index: int, prompt_len: int, seed: int) -> tuple[int, ...]:
    """One distinct hash a full prompt block: no two prompts share a prefix, a request finds its own."""
    base = (seed * 1_000_003 + index + 1) << 20
    return tuple(base + b for b in range(prompt_len // BLOCK))


def requests(run: dict, seed: int) -> tuple[list[SimRequest], int | None]:
    """The run's requests as its client sent them, and its closed loop's concurrency (None: open)."""
    w = run["workload"]
    n = int(w.get("num_prompts") or 1000)
    rate = w.get("request_rate")
    rate = None if rate in (None, "inf", float("inf")) else float(rate)
    rng = np.random.default_rng(seed)
    if w.get("input_len"):  # the random dataset: fixed lengths (vLLM's default range ratio 0)
        pin = np.full(n, int(w["input_len"]))
        pout = np.full(n, int(w.get("output_len") or 128))
    else:
        mean_in = (w.get("total_input_tokens") or SHAREGPT_MEANS[0] * n) / n
        mean_out = (w.get("total_output_tokens") or SHAREGPT_MEANS[1] * n) / n
        a, b = np.clip(rng.lognormal(0, 0.9, n), 0.02, None), np.clip(rng.lognormal(0, 0.9, n), 0.01, None)
        pin = np.clip(np.round(a / a.mean() * mean_in), 4, 1024).astype(int)
        pout = np.clip(np.round(b / b.mean() * mean_out), 1, 2048).astype(int)
    arr = np.zeros(n) if rate is None else np.cumsum(rng.exponential(1 / rate, n))
    return [SimRequest(float(t), int(p), int(o), prompt_hashes(i, int(p), seed))
            for i, (t, p, o) in enumerate(zip(arr, pin, pout))], w.get("max_concurrency")


def with_hashes(reqs: list[SimRequest], seed: int = 0) -> list[SimRequest]:
    return [SimRequest(r.arrival, r.prompt_len, r.output_len, prompt_hashes(i, r.prompt_len, seed))
            for i, r in enumerate(reqs)]


def chunk_gaps(times: list[float]) -> list[float]:
    """The ITLs the client measures: one per streamed chunk after the first, and tokens that reach it
    together (a multi-step burst, a speculative step's accepted tokens) come in one chunk."""
    arrivals = [t for i, t in enumerate(times) if i == 0 or t != times[i - 1]]
    return [b - a for a, b in zip(arrivals, arrivals[1:])]


def figures(recs) -> dict[str, float]:
    """The figures `vllm bench serve` prints, from the simulated records."""
    dur = max(r.finish_s for r in recs) - min(r.sent_s for r in recs)
    ttft = [r.ttft * 1e3 for r in recs]
    tpot = [r.tpot * 1e3 for r in recs if r.output_tokens > 1]
    itl = [g * 1e3 for r in recs for g in chunk_gaps(r.token_times or [])]
    e2e = [(r.finish_s - r.sent_s) * 1e3 for r in recs]
    out_tok, in_tok = sum(r.output_tokens for r in recs), sum(r.prompt_tokens or 0 for r in recs)
    q = lambda xs, p: float(np.percentile(xs, p)) if xs else math.nan  # noqa: E731
    return {"req_per_s": len(recs) / dur, "output_tok_per_s": out_tok / dur, "total_tok_per_s": (out_tok + in_tok) / dur,
            "mean_ttft_ms": statistics.fmean(ttft), "median_ttft_ms": q(ttft, 50), "p99_ttft_ms": q(ttft, 99),
            "mean_tpot_ms": statistics.fmean(tpot) if tpot else math.nan, "median_tpot_ms": q(tpot, 50),
            "p99_tpot_ms": q(tpot, 99), "mean_itl_ms": statistics.fmean(itl) if itl else math.nan,
            "median_itl_ms": q(itl, 50), "p99_itl_ms": q(itl, 99), "median_e2el_ms": q(e2e, 50),
            "duration_s": dur}


def _gpu(name: str, gpus: dict | None):
    """The GPU's profile, with a fit's trial values of its fields (`gpus`: key -> {field: value})."""
    gpu = get_gpu(name)
    return gpu.model_copy(update=gpus[gpu.key]) if gpus and gpu.key in gpus else gpu


def _run(cfg, reqs, params, flags: dict, conc: int | None = None) -> dict[str, float]:
    """The figures of one re-simulation; V0's `--num-scheduler-steps` runs its decodes in bursts."""
    core = EngineCore(cfg, params)
    core.multi_step = int(flags.get("num_scheduler_steps") or 1)
    return figures(run_virtual(cfg, reqs, token_times=True, max_concurrency=conc, engine=core).records)


def simulate(run: dict, seed: int = 0, params: CostParams | None = None, gpus: dict | None = None) -> dict[str, float]:
    if "_make" in run:  # an older case of calibration.py: its own knobs and requests
        cfg = resolve(_gpu(run["gpu"], gpus), get_model(run["model"]), run["_knobs"])
        return _run(cfg, with_hashes(run["_make"]()), params, run["flags"])
    name, extra = checkpoint(run)
    gpu, model = _gpu(run["gpu"], gpus), get_model(name)
    flags = {**(run.get("flags") or {}), **extra}
    knobs = version_knobs(run.get("vllm_version"), gpu, flags, int(run.get("gpus") or 1))
    reqs, conc = requests(run, seed)
    return _run(resolve(gpu, model, knobs), reqs, params, flags, conc)


def old_cases() -> list[dict]:
    """`calibration.py`'s cases as runs of the set (their requests made by their own functions), with the
    flags their source states that `Knobs` does not hold."""
    out = []
    for label, source, model, gpu, knobs, make, published in CASES:
        out.append({"id": "case-" + str(zlib.crc32(label.encode())), "source": source, "label": label, "model": model,
                    "gpu": gpu, "dtype": None, "_knobs": knobs, "_make": make, "flags": SOURCE_FLAGS.get(source, {}),
                    "figures": {{"out_tok_per_s": "output_tok_per_s"}.get(k, k): v for k, v in published.items()}})
    return out


def all_runs() -> list[dict]:
    return yaml.safe_load(DATA.read_text()) + old_cases()


def gpu_key(run: dict) -> str:
    try:
        return get_gpu(run["gpu"]).key
    except (UserError, KeyError):
        return str(run["gpu"])


def evaluate(params: CostParams | None = None, only=None, part: bool | None = None, gpus: dict | None = None):
    """(rows, skipped): one row per figure, (run id, held out, kind, metric, published, simulated, GPU);
    `part` False/True keeps the fitted/held-out runs only (a fit passes False); `gpus`: GPU profile fields
    a fit tries (key -> {field: value})."""
    rows, skipped = [], []
    for run in all_runs():
        if (only and run["id"] not in only) or (part is not None and held_out(run["id"]) != part):
            continue
        try:
            sim = simulate(run, params=params, gpus=gpus)
        except (UserError, LaunchFailure, ValueError, KeyError) as e:
            skipped.append((run["id"], str(e).splitlines()[0][:140]))
            continue
        for metric, pub in (run.get("figures") or {}).items():
            if metric in KINDS and pub and metric in sim and math.isfinite(sim[metric]):
                rows.append((run["id"], held_out(run["id"]), KINDS[metric], metric, float(pub), sim[metric],
                             gpu_key(run)))
    return rows, skipped


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--markdown", action="store_true", help="the results page's section (tables and a plot)")
    ap.add_argument("--only", nargs="*", default=None, help="run ids")
    args = ap.parse_args(argv)
    rows, skipped = evaluate(only=args.only)
    from _calib_report import markdown, text
    print(markdown(rows, skipped) if args.markdown else text(rows, skipped))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
