"""A `tune --strategy grid` study on the in-process simulator, printed as a markdown table of what each
configuration measured: its capacity, the bracket the knee search closed, and what binds it.

Used by run_all.py for the sections whose numbers are one grid study (the parallel layout on a simulated
8-GPU host, issue 16), so those sections are regenerated with the current code like every other. The
study runs exactly as a user runs it (`python -m tuner.cli ... --strategy grid --no-confirm`), in a
temporary run directory; its progress goes to stderr, the table to stdout.

Run: python benchmarks/tune_grid.py --workload W --slo S --gpu G --model M --search-space SPACE
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def knobs_text(knobs: dict) -> str:
    def value(k: str, v: object) -> str:
        if k == "speculative_config":  # a JSON object: its method and draft length say which it is
            spec = json.loads(v) if isinstance(v, str) else v
            return f"{spec['method']} k={spec['num_speculative_tokens']}"
        return str(v)
    return ", ".join(f"{k}={value(k, v)}" for k, v in sorted(knobs.items())) or "vLLM defaults"


def short(text: str, limit: int = 110) -> str:
    """A diagnosis summary cut at a clause's end (the table has one line a trial; report.md has the rest)."""
    if len(text) <= limit:
        return text
    cut = max(text.rfind(": ", 0, limit), text.rfind(". ", 0, limit))
    return text[:cut] if cut > limit // 2 else text[:limit] + "..."


def table(report: dict) -> list[str]:
    rows = ["| trial | configuration | capacity (req/s) | passed clearly .. failed clearly | binds | load runs |",
            "|---|---|---|---|---|---|"]
    for t in report["trials"]:
        d = t.get("diagnosis") or {}
        if t.get("capacity_rps") is None:
            what = "launch failed" if not t.get("launched", True) else "no rate met the SLO"
            cap, bracket = what, "-"
        else:
            cap = f"{t['capacity_rps']:.2f}"
            upper = t.get("capacity_upper_rps")
            bracket = f"{t['capacity_rps']:.2f} .. {upper:.2f}" if upper else f"{t['capacity_rps']:.2f} .. -"
        summary = short((d.get("summary") or "").replace("|", "/"))
        rows.append(f"| {t['number']} | {knobs_text(t['knobs'])} | {cap} | {bracket} | "
                    f"{d.get('kind', '-')}: {summary} | {t.get('load_runs', 0)} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag in ("--workload", "--gpu", "--model", "--search-space"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--slo", required=True, action="append", help="one study per --slo, a table each")
    args, extra = ap.parse_known_args(argv)
    for slo in args.slo:
        rc = study(args, slo, extra)
        if rc:
            return rc
    return 0


def study(args: argparse.Namespace, slo: str, extra: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="tune-grid-") as tmp:
        cmd = ["--workload", args.workload, "--slo", slo, "--gpu", args.gpu, "--model", args.model,
               "--search-space", args.search_space, "--strategy", "grid", "--no-confirm", *extra]
        proc = subprocess.run([sys.executable, "-m", "tuner.cli", *cmd, "--out", f"{tmp}/run"], cwd=ROOT,
                              stdout=sys.stderr)
        if proc.returncode:
            print(f"tune_grid.py: the study with --slo {slo} exited {proc.returncode}", file=sys.stderr)
            return proc.returncode
        report = json.loads(Path(tmp, "run", "report.json").read_text())
    print(f"**SLO {report.get('slo_text', '?')}** (`{slo}`): `tune {' '.join(cmd)}`, "
          f"{len(report['trials'])} trials on the in-process simulator, no noise.")
    print()
    print("\n".join(table(report)))
    rec = report.get("recommendation") or {}
    if rec.get("knobs") is not None:
        print()
        print(f"Recommended: trial {rec.get('trial')}, {knobs_text(rec['knobs'])}, "
              f"{rec['capacity_rps']:.2f} req/s.")
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
