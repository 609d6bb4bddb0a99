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

DATA = HERE / "data" / "calibration_published.yaml"
#: ShareGPT through `vllm bench serve` (REFERENCE.md section 6): about 200 input / 190 output tokens a request
SHAREGPT_MEANS = (215.0, 194.0)
KINDS = {"req_per_s": "throughput", "output_tok_per_s": "throughput", "total_tok_per_s": "throughput",
         "mean_tpot_ms": "TPOT/ITL", "median_tpot_ms": "TPOT/ITL", "p99_tpot_ms": "TPOT/ITL",
         "mean_itl_ms": "TPOT/ITL", "median_itl_ms": "TPOT/ITL", "p99_itl_ms": "TPOT/ITL",
         "mean_ttft_ms": "TTFT mean/median", "median_ttft_ms": "TTFT mean/median", "p99_ttft_ms": "TTFT p99",
         "median_e2el_ms": "latency", "duration_s": "latency"}
DTYPES = ("bf16", "fp16", None)


def held_out(run_id: str) -> bool:
    """About 30% of the runs, fixed by their ids: never looked at by a fit."""
    return zlib.crc32(run_id.encode()) % 10 < 3


def _version(v: str | None) -> tuple[int, int]:
    parts = [int(x) for x in str(v or "0.32").split(".")[:2] if x.isdigit()]
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


def version_knobs(version: str | None, gpu, flags: dict, gpus: int) -> Knobs:
    """The run's flags, and the batch defaults of the vLLM it ran: V0 (before 0.8) took 256 sequences and,
    without chunked prefill, a whole prompt a step (`max_num_batched_tokens` = the context); V1 took
    `EngineArgs.get_batch_defaults` (the simulator's `vllm_batch_defaults`)."""
    known = {k: v for k, v in flags.items() if k in Knobs.model_fields}
    if gpus > 1:
        known["tensor_parallel_size"] = gpus
    if _version(version) < (0, 8):
        known.setdefault("max_num_seqs", 256)
        known.setdefault("max_num_batched_tokens", max(int(known.get("max_model_len") or 4096), 2048))
    else:
        seqs, tokens = vllm_batch_defaults(gpu)
        known.setdefault("max_num_seqs", seqs)
        known.setdefault("max_num_batched_tokens", tokens)
    return Knobs(**known)


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
    return [SimRequest(float(t), int(p), int(o)) for t, p, o in zip(arr, pin, pout)], w.get("max_concurrency")


def figures(recs) -> dict[str, float]:
    """The figures `vllm bench serve` prints, from the simulated records."""
    dur = max(r.finish_s for r in recs) - min(r.sent_s for r in recs)
    ttft = [r.ttft * 1e3 for r in recs]
    tpot = [r.tpot * 1e3 for r in recs if r.output_tokens > 1]
    itl = [(b - a) * 1e3 for r in recs for a, b in zip(r.token_times or [], (r.token_times or [])[1:])]
    e2e = [(r.finish_s - r.sent_s) * 1e3 for r in recs]
    out_tok, in_tok = sum(r.output_tokens for r in recs), sum(r.prompt_tokens or 0 for r in recs)
    q = lambda xs, p: float(np.percentile(xs, p)) if xs else math.nan  # noqa: E731
    return {"req_per_s": len(recs) / dur, "output_tok_per_s": out_tok / dur, "total_tok_per_s": (out_tok + in_tok) / dur,
            "mean_ttft_ms": statistics.fmean(ttft), "median_ttft_ms": q(ttft, 50), "p99_ttft_ms": q(ttft, 99),
            "mean_tpot_ms": statistics.fmean(tpot) if tpot else math.nan, "median_tpot_ms": q(tpot, 50),
            "p99_tpot_ms": q(tpot, 99), "mean_itl_ms": statistics.fmean(itl) if itl else math.nan,
            "median_itl_ms": q(itl, 50), "p99_itl_ms": q(itl, 99), "median_e2el_ms": q(e2e, 50),
            "duration_s": dur}


def simulate(run: dict, seed: int = 0) -> dict[str, float]:
    if run.get("dtype") not in DTYPES:
        raise ValueError(f"dtype {run.get('dtype')} is not modelled")
    gpu, model = get_gpu(run["gpu"]), get_model(run["model"])
    knobs = version_knobs(run.get("vllm_version"), gpu, run.get("flags") or {}, int(run.get("gpus") or 1))
    reqs, conc = requests(run, seed)
    cfg = resolve(gpu, model, knobs)
    return figures(run_virtual(cfg, reqs, token_times=True, max_concurrency=conc).records)


def old_cases() -> list[dict]:
    """`calibration.py`'s cases as runs of the set (their requests made by their own functions)."""
    out = []
    for label, source, model, gpu, knobs, make, published in CASES:
        out.append({"id": "case-" + str(zlib.crc32(label.encode())), "source": source, "label": label, "model": model,
                    "gpu": gpu, "dtype": None, "_knobs": knobs, "_make": make,
                    "figures": {{"out_tok_per_s": "output_tok_per_s"}.get(k, k): v for k, v in published.items()}})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--only", nargs="*", default=None, help="run ids")
    args = ap.parse_args(argv)
    runs = yaml.safe_load(DATA.read_text()) + old_cases()
    rows, skipped = [], []
    for run in runs:
        if args.only and run["id"] not in args.only:
            continue
        try:
            if "_make" in run:
                cfg = resolve(get_gpu(run["gpu"]), get_model(run["model"]), run["_knobs"])
                sim = figures(run_virtual(cfg, run["_make"](), token_times=True).records)
            else:
                sim = simulate(run)
        except (UserError, LaunchFailure, ValueError, KeyError) as e:
            skipped.append((run["id"], str(e)[:120]))
            continue
        for metric, pub in (run.get("figures") or {}).items():
            if metric in KINDS and pub and metric in sim and math.isfinite(sim[metric]):
                rows.append((run["id"], held_out(run["id"]), KINDS[metric], metric, float(pub), sim[metric]))
    for rid, out, kind, metric, pub, s in rows:
        print(f"{'held-out' if out else 'fit':8s} {rid[:58]:58s} {metric:17s} pub {pub:10.2f} sim {s:10.2f} "
              f"{s / pub - 1:+6.0%}")
    print()
    for part in (False, True):
        sel = [r for r in rows if r[1] == part]
        print(f"{'held-out' if part else 'fit'} part: {len(sel)} figures")
        for kind in sorted({r[2] for r in sel}):
            errs = [abs(r[5] / r[4] - 1) for r in sel if r[2] == kind]
            print(f"  {kind:18s} {len(errs):3d} figures: within 25% {sum(e <= 0.25 for e in errs) / len(errs):.0%}, "
                  f"within 10% {sum(e <= 0.10 for e in errs) / len(errs):.0%}, median |error| "
                  f"{statistics.median(errs):.0%}")
    for rid, why in skipped:
        print(f"skipped {rid}: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
