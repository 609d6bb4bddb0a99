"""A study's measurements and decisions as canonical JSON, to show a refactoring changed no answer.

Issue 62 asks that restructuring the code leave every study the same: the same trials, in the same order,
measured at the same rates with the same verdicts and capacities, the same acceptances and the same
recommendation. This dumps what a run directory's study holds, less what no two runs share (wall-clock
seconds, timestamps, host load), with floats rounded to 9 significant digits so that a reordering of
a float sum does not read as a change while any real change still does. `--diff A B` prints a unified
diff of two run directories' dumps and exits 1 when they differ (0: the same).

    python tools/study_dump.py RUN_DIR                # the dump, to stdout
    python tools/study_dump.py --diff RUN_A RUN_B     # before/after: empty and exit 0 when unchanged
    python tools/study_dump.py --scenarios DIR        # run every shipped scenario into DIR/<name>
    python tools/study_dump.py --diff DIR_A DIR_B     # two such folders: every scenario's diff

`--scenarios` runs each of `workloads/`'s workload and SLO pairs (the seed scenarios) as the README's
main job does (default strategy, the simulated RTX 4090 and Qwen2.5-7B, seed 0) with `--max-trials 6`:
run it on the commit before a refactoring and on the one after, then diff the two folders.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

#: record fields that hold real (wall-clock) time or its by-products: they differ between two runs of the
#: same study on a simulated engine, and between hosts
VOLATILE = {"wall_s", "launch_s", "load_wall_s", "seconds"}


def _bad_input(message: str) -> None:
    """A user's mistake: one line, exit 2, as every command of the project."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def _canonical(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in sorted(value.items()) if k not in VOLATILE}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def dump(run_dir: Path) -> dict[str, Any]:
    """The study's trials (number, state, role, record) and the report's answer, canonical."""
    db = run_dir / "study.db"
    if not db.is_file():
        _bad_input(f"{run_dir}: no study.db (a run directory of `tune` on SQLite storage)")
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)  # never written
    try:
        trials = con.execute("SELECT trial_id, number, state FROM trials ORDER BY number").fetchall()
        attrs: dict[int, dict[str, Any]] = {}
        for trial_id, key, value in con.execute("SELECT trial_id, key, value_json FROM trial_user_attributes"):
            attrs.setdefault(trial_id, {})[key] = json.loads(value)
    finally:
        con.close()
    out: dict[str, Any] = {"trials": [
        {"number": n, "state": state, **_canonical(attrs.get(tid, {}))} for tid, n, state in trials]}
    report = run_dir / "report.json"
    if report.is_file():
        rep = json.loads(report.read_text())
        out["answer"] = _canonical({k: rep.get(k) for k in ("status", "tuned", "recommendation", "headline")})
    return out


ROOT = Path(__file__).resolve().parents[1]
W = ROOT / "workloads"
#: the seed scenarios: every workload and SLO file `workloads/` ships (tests/e2e/test_tune_scenarios.py
#: holds that list complete), with the options each needs
SCENARIOS: dict[str, list[str]] = {
    "chat": ["chat.jsonl", "chat.slo.yaml"],
    "chat-strict": ["chat.jsonl", "chat-strict.slo.yaml"],
    "rag": ["rag.jsonl", "rag.slo.yaml"],
    "multitenant": ["multitenant.jsonl", "multitenant.slo.yaml"],
    "azure": ["azure_conv_excerpt.csv", "azure.slo.yaml", "--arrival", "trace"],
    "multitenant-lora": ["multitenant-lora.jsonl", "multitenant-lora.slo.yaml", "--lora-dir",
                         str(W / "multitenant-lora.adapters.yaml"), "--search-space", "multitenant-lora"],
    "smollm2": ["smollm2-questions.jsonl", "smollm2-cpu.slo.yaml"],
}


def run_scenarios(dest: Path) -> int:
    """Each seed scenario's study into dest/<name> with this checkout's code; the exit codes printed."""
    if dest.exists():
        _bad_input(f"{dest}: exists; give a new folder")
    dest.mkdir(parents=True)
    for name, (workload, slo, *extra) in SCENARIOS.items():
        args = [sys.executable, "-m", "tuner.cli", "--workload", str(W / workload), "--slo", str(W / slo),
                "--gpu", "rtx4090", "--model", "qwen2.5-7b", "--seed", "0", "--max-trials", "6", "--no-confirm",
                *extra, "--out", str(dest / name)]
        p = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
        print(f"{name}: exit {p.returncode}", file=sys.stderr, flush=True)
    return 0


def diff(before: Path, after: Path) -> list[str]:
    """The unified diff of two run directories' dumps, or of every scenario of two `--scenarios` folders."""
    for d in (before, after):
        if not d.is_dir():
            _bad_input(f"{d}: no such folder")
    if (before / "study.db").is_file():
        return list(difflib.unified_diff(text(before), text(after), str(before), str(after)))
    names = sorted({p.name for p in before.iterdir() if p.is_dir()} | {p.name for p in after.iterdir() if p.is_dir()})
    out: list[str] = []
    for name in names:
        a, b = before / name, after / name
        if not (a / "study.db").is_file() or not (b / "study.db").is_file():
            out.append(f"{name}: a study in only one of the two folders\n")
            continue
        out += diff(a, b)
    return out


def text(run_dir: Path) -> list[str]:
    return json.dumps(dump(run_dir), indent=1, sort_keys=True).splitlines(keepends=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", nargs="?", type=Path)
    ap.add_argument("--diff", nargs=2, type=Path, metavar=("RUN_A", "RUN_B"))
    ap.add_argument("--scenarios", type=Path, metavar="DIR", help="run every seed scenario into DIR/<name>")
    a = ap.parse_args(argv)
    if a.scenarios:
        return run_scenarios(a.scenarios)
    if a.diff:
        lines = diff(*a.diff)
        sys.stdout.writelines(lines)
        return 1 if lines else 0
    if a.run_dir is None:
        ap.error("give RUN_DIR or --diff RUN_A RUN_B")
    sys.stdout.writelines(text(a.run_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
