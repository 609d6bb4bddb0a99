"""The LoRA studies on the simulator, wall time per study, this tree against another (issue 59, Must show 5).

Two studies, each a whole `tune` process timed from outside: the README's LoRA example (docs/lora.md:
`workloads/multitenant-lora.jsonl`, its SLO and adapter catalog, the `multitenant-lora` space, default
strategy) and the 100-adapter study (`tune workload synth --kind multitenant-lora --adapters 100`, the same
SLO and space, `--max-trials 6 --time-budget 360`). With `--against TREE` (a checkout of another commit,
e.g. `git worktree add /tmp/old a0d0f8d`) each study runs under both trees in turn, this tree first, A B A
B ..., so a drift of the host's speed reaches both sides; printed: each run's wall seconds, the medians and
the pair-by-pair ratio. For this tree's runs, where the time went by the report's own table (report.json's
`time_use`: launching, load runs, scoring, between trials: the twin's fits and ranking) against the whole
process's wall: the rest is start-up and writing the report.

    python benchmarks/lora_studies.py [--against TREE] [--repeats 3] [--cap-s 600]

A study stopped at `--cap-s` is printed as "> cap"; a pair whose other side was stopped gives an upper
bound on the ratio ("<"): that side would have taken longer.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
W = ROOT / "workloads"
SIM = ["--gpu", "rtx4090", "--model", "qwen2.5-7b", "--search-space", "multitenant-lora", "--no-confirm"]


def studies(tmp: Path, tree: Path) -> dict[str, list[str]]:
    """Each study's arguments; the 100-adapter workload is made once, by this tree, for both."""
    hundred = tmp / "lora100.jsonl"
    if not hundred.exists():
        subprocess.run([sys.executable, "-m", "tuner.cli", "workload", "synth", "--kind", "multitenant-lora",
                        "--adapters", "100", "--out", str(hundred)], check=True, capture_output=True, cwd=ROOT)
    return {
        "readme": ["--workload", str(W / "multitenant-lora.jsonl"), "--slo", str(W / "multitenant-lora.slo.yaml"),
                   "--lora-dir", str(W / "multitenant-lora.adapters.yaml"), *SIM],
        "adapters100": ["--workload", str(hundred), "--slo", str(W / "multitenant-lora.slo.yaml"),
                        "--lora-dir", str(tmp / "lora100.adapters.yaml"), *SIM, "--max-trials", "6",
                        "--time-budget", "360"],
    }


def run(tree: Path, args: list[str], out: Path, cap_s: float) -> tuple[float, int | None]:
    """The study's wall seconds and exit code; None: it ran past `cap_s` and was stopped (its whole
    process group, so nothing outlives it), its wall then only a lower bound."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "tuner.cli", *args, "--out", str(out)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, cwd=tree, env=env, start_new_session=True)
    try:
        _, err = p.communicate(timeout=cap_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return time.perf_counter() - t0, None
    wall = time.perf_counter() - t0
    if p.returncode not in (0, 1):
        sys.exit(f"{tree}: exit {p.returncode}\n{err[-2000:]}")
    return wall, p.returncode


def where_time_went(out: Path, wall: float) -> str:
    rep = json.loads((out / "report.json").read_text())
    u = rep.get("time_use")
    tuned = rep.get("tuned") or {}
    answer = (f"recommended {tuned.get('capacity_rps') or 0:.2f} req/s "
              f"{json.dumps(tuned.get('knobs', {}), sort_keys=True)}")
    if not u:
        return f"no time table; {answer}"
    table = u["launch_s"] + u["load_runs_s"] + u["other_trial_s"] + (u["between_trials_s"] or 0)
    return (f"{u['trials']} trials: launching {u['launch_s']:.1f} s, load runs {u['load_runs_s']:.1f} s, "
            f"scoring {u['other_trial_s']:.1f} s, between trials (fits, ranking) "
            f"{u['between_trials_s'] if u['between_trials_s'] is None else round(u['between_trials_s'], 1)} s; "
            f"table total {table:.1f} s of {wall:.1f} s wall (the rest: start-up, the report); {answer}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", type=Path, help="another checkout to pair with (run in turn with this tree)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--studies", default="readme,adapters100")
    ap.add_argument("--cap-s", type=float, default=600, help="stop a study after this long (its wall: a bound)")
    a = ap.parse_args()
    trees = [("this", ROOT)] + ([("against", a.against.resolve())] if a.against else [])
    with tempfile.TemporaryDirectory(prefix="lora-studies-") as d:
        tmp = Path(d)
        names = a.studies.split(",")
        walls: dict[tuple[str, str], list[float]] = {}
        capped: set[tuple[str, str, int]] = set()
        for i in range(a.repeats):
            for name in names:
                for label, tree in trees:
                    out = tmp / f"{name}-{label}-{i}"
                    wall, rc = run(tree, studies(tmp, ROOT)[name], out, a.cap_s)
                    walls.setdefault((name, label), []).append(wall)
                    if rc is None:
                        capped.add((name, label, i))
                    line = (f"{name:12s} {label:8s} run {i + 1}: {wall:6.1f} s exit {rc}" if rc is not None else
                            f"{name:12s} {label:8s} run {i + 1}: > {a.cap_s:.0f} s (stopped there)")
                    if label == "this" and rc is not None:
                        line += "  " + where_time_went(out, wall)
                    print(line, flush=True)
        print()
        for name in names:
            this = walls[(name, "this")]
            row = f"{name:12s} this tree: median {statistics.median(this):.1f} s (min {min(this):.1f}, max {max(this):.1f})"
            if a.against:
                other = walls[(name, "against")]
                ratios = [x / y for x, y in zip(this, other)]
                marks = ["<" if (name, "against", i) in capped else "" for i in range(len(ratios))]
                row += (f"; {a.against}: median {statistics.median(other):.1f} s"
                        + (" (some stopped at the cap: a lower bound)" if any(marks) else "")
                        + "; pairs this/against " + ", ".join(f"{m}{r:.2f}x" for m, r in zip(marks, ratios))
                        + f", median {'<' if any(marks) else ''}{statistics.median(ratios):.2f}x")
            print(row)


if __name__ == "__main__":
    main()
