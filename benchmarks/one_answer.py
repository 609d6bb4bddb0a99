"""One answer: the same study under seeds 0-4 (issue 57's item 1), on the scenarios it names.

Each study is `tune` as a user runs it (the default strategy and the default paired check), only
`--seed` changing; two run side by side on a 2-core host. For each seed: the decision (keep the
defaults, or which knobs), the paired gain over vLLM's defaults with its 95% interval, the search's best
and its paired gain, the launches the paired check spent, and the study's wall time. Then the agreement:
how many of the seeds give the most common decision with the same knob set.

    python benchmarks/one_answer.py [--scenarios main strict rag] [--seeds 0 1 2 3 4] [--jobs 2] [--json F]
                                    [--truth-windows 40] [--plan-verify]

Then (`--truth-windows`, `benchmarks/one_answer_truth.py`) every answer is scored against the careful
truth: each configuration the studies named, measured on many more windows than a study spends.

Printed: markdown (the `one_answer` part of the results, `benchmarks/results/sections/`), progress on stderr.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
SCENARIOS = {
    "main": ("the README's main job: chat, p99 TTFT <= 300 ms / TPOT <= 50 ms, Qwen2.5-7B on an RTX 4090",
             ["--workload", "workloads/chat.jsonl", "--slo", "workloads/chat.slo.yaml", "--gpu", "rtx4090",
              "--model", "qwen2.5-7b"]),
    "strict": ("strict-TPOT chat: p99 TTFT <= 500 ms / TPOT <= 25 ms, Qwen2.5-7B on an RTX 4090",
               ["--workload", "workloads/chat.jsonl", "--slo", "workloads/chat-strict.slo.yaml", "--gpu",
                "rtx4090", "--model", "qwen2.5-7b"]),
    "rag": ("32k-token RAG on the H100: Llama-3.1-8B, the rag space",
            ["--workload", "workloads/rag.jsonl", "--slo", "workloads/rag.slo.yaml", "--gpu", "h100", "--model",
             "llama-3.1-8b", "--search-space", "rag"]),
}


def plan_and_verify(out: Path) -> dict:
    """`tune plan RUN --json` and `tune plan RUN --verify` on a finished study: the plan's instances (with
    its headroom, and at the peak with none) beside the fleet simulation's smallest N per policy (item 5)."""
    p = subprocess.run([sys.executable, "-m", "tuner.cli", "plan", str(out), "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    if p.returncode:
        return {"plan_error": (p.stderr.strip().splitlines() or ["?"])[-1][:200]}
    plan = json.loads(p.stdout)
    v = subprocess.run([sys.executable, "-m", "tuner.cli", "plan", str(out), "--verify"], cwd=ROOT,
                       capture_output=True, text=True, timeout=1800)
    fleet = out / "fleet" / "fleet.json"
    if v.returncode or not fleet.exists():
        return {"plan_error": (v.stderr.strip().splitlines() or ["?"])[-1][:200]}
    ver = json.loads(fleet.read_text())
    return {"plan_n": plan["instances"], "plan_at_peak": plan["instances_at_peak"],
            "plan_rate": plan["rate_per_instance"],
            "verified": {r["policy"]: r["verified_n"] for r in ver["policies"]}}


def run_one(scenario: str, seed: int, base: Path, plan: bool = False) -> dict:
    out = base / f"{scenario}-{seed}"
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "tuner.cli", *SCENARIOS[scenario][1], "--seed", str(seed),
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    row = {"scenario": scenario, "seed": seed, "wall_s": wall, "rc": p.returncode}
    rep_path = out / "report.json"
    if not rep_path.exists():
        row["error"] = (p.stderr.strip().splitlines() or ["no report"])[-1][:200]
        return row
    rep = json.loads(rep_path.read_text())
    r = rep["recommendation"]
    study_attrs = _earned(out)
    row.update(kind=r["kind"], knobs=r["knobs"], gain=r.get("gain_pct"), low=r.get("gain_low_pct"),
               high=r.get("gain_high_pct"), paired=r.get("paired"), best_knobs=r.get("best_knobs"),
               best_gain=r.get("best_gain_pct"), capacity=r.get("capacity_rps"),
               defaults=r.get("defaults_capacity_rps"), launches=study_attrs.get("launches"),
               line=p.stdout.strip().splitlines()[-6:] if p.stdout else [])
    print(f"{scenario} seed {seed}: {wall:.1f} s, {r['kind']} {r['knobs']}", file=sys.stderr)
    if plan:
        row.update(plan_and_verify(out))
    return row


def _earned(out: Path) -> dict:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{out / 'study.db'}")
    return study.user_attrs.get("earned") or {}


def _answer(row: dict) -> str:
    if "kind" not in row:
        return "error"
    if row["kind"] != "tuned":
        return row["kind"]
    return " ".join(f"{k}={v}" for k, v in sorted(row["knobs"].items()))


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:+.1f}%"


def _agreement(mine: list[dict]) -> str:
    """How many seeds give the most common answer: among the first five (issue 57's item 1) and all."""
    parts = []
    for group in ([mine[:5], mine] if len(mine) > 5 else [mine]):
        top, count = collections.Counter(_answer(r) for r in group).most_common(1)[0]
        seeds = f"seeds {group[0]['seed']}-{group[-1]['seed']}"
        parts.append(f"The same decision and knob set in **{count} of {len(group)}** {seeds} (`{top}`).")
    return " ".join(parts)


def report(rows: list[dict]) -> str:
    out = [f"Host: {platform.node()}, {platform.processor() or platform.machine()}; "
           f"{time.strftime('%Y-%m-%d %H:%M')}.", ""]
    for sc in dict.fromkeys(r["scenario"] for r in rows):
        mine = sorted((r for r in rows if r["scenario"] == sc), key=lambda r: r["seed"])
        out += [f"**{sc}**: {SCENARIOS[sc][0]}. {_agreement(mine)}", "",
                "| seed | answer | paired gain [95%] | defaults (req/s, windows) | search's best | its paired gain "
                "| paired launches | wall s |", "|---|---|---|---|---|---|---|---|"]
        for r in mine:
            if "kind" not in r:
                out.append(f"| {r['seed']} | error: {r.get('error')} | | | | | | {r['wall_s']:.1f} |")
                continue
            gain = f"{_pct(r['gain'])} [{_pct(r['low'])}, {_pct(r['high'])}]" if r["gain"] is not None else "-"
            best = " ".join(f"{k}={v}" for k, v in (r["best_knobs"] or {}).items()) or "defaults"
            out.append(f"| {r['seed']} | {_answer(r)} | {gain} | "
                       f"{r['defaults']:.2f} | {best} | {_pct(r['best_gain'])} | {r['launches']} | "
                       f"{r['wall_s']:.1f} |" if r["defaults"] else
                       f"| {r['seed']} | {_answer(r)} | {gain} | n/a | {best} | {_pct(r['best_gain'])} | "
                       f"{r['launches']} | {r['wall_s']:.1f} |")
        out.append("")
        out += _plan_table(mine)
    return "\n".join(out)


def _plan_table(mine: list[dict]) -> list[str]:
    """The plan against its fleet verification, per seed (only where `--plan-verify` ran them)."""
    rows = [r for r in mine if "plan_n" in r or "plan_error" in r]
    if not rows:
        return []
    agree = sum(1 for r in rows if "plan_n" in r and r["verified"] and
                all(n is not None and abs(n - r["plan_at_peak"]) <= 1 for n in r["verified"].values()))
    out = [f"The capacity plan against `tune plan --verify` (peak from the SLO file): the verified N agrees "
           f"with the plan's N at the peak within one replica, under every policy, in **{agree} of {len(rows)}** "
           "seeds.", "", "| seed | req/s per instance | plan N (headroom) | plan N at the peak | verified N |",
           "|---|---|---|---|---|"]
    for r in rows:
        if "plan_error" in r:
            out.append(f"| {r['seed']} | error: {r['plan_error']} | | | |")
            continue
        ver = ", ".join(f"{k} {v}" for k, v in r["verified"].items())
        out.append(f"| {r['seed']} | {r['plan_rate']:.3f} | {r['plan_n']} | {r['plan_at_peak']} | {ver} |")
    return out + [""]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--plan-verify", action="store_true",
                    help="also run `tune plan` and `tune plan --verify` on each study (issue 57's item 5)")
    ap.add_argument("--json", type=Path, help="also write the rows here (benchmarks/one_answer_truth.py reads them)")
    ap.add_argument("--truth-windows", type=int, default=40,
                    help="then score every answer against the careful truth on this many windows (0: skip)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(a.jobs) as pool:
        jobs = [pool.submit(run_one, sc, s, Path(tmp), a.plan_verify) for sc in a.scenarios for s in a.seeds]
        rows = [j.result() for j in jobs]
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1, default=str))
    print(report(rows))
    if a.truth_windows:
        from one_answer_truth import truth_report

        print("### Against the careful truth\n")
        print(truth_report(rows, a.truth_windows, 0.05, a.jobs))


if __name__ == "__main__":
    main()
