"""Run every benchmark and write benchmarks/RESULTS.md (one page: tables, the plot, the machine).

    python benchmarks/run_all.py            # about 15 minutes on a 2-core machine, cached grids reused
    python benchmarks/run_all.py --fresh    # recompute the ground-truth grids too

Each benchmark's own output is quoted as it printed it, so every number on the page was measured by the
run that wrote the page.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

BENCHMARKS = [
    ("Search cost and quality (issue 7)", ["search_efficiency.py", "--seeds", "10"]),
    ("Knee search: load runs per capacity measurement", ["knee_search.py", "--seeds", "5"]),
    ("Simulator speed", ["sim_speed.py", "--repeat", "3"]),
    ("Simulator calibration against published vLLM runs", ["calibration.py"]),
    ("Replay client schedule precision", ["replay_precision.py"]),
]


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB memory, {platform.system()} "
            f"{platform.machine()}, Python {platform.python_version()}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--only", help="comma-separated script names to run")
    args = ap.parse_args(argv)
    sections = []
    t_all = time.perf_counter()
    for title, cmd in BENCHMARKS:
        if args.only and cmd[0] not in args.only.split(","):
            continue
        full = [sys.executable, str(HERE / cmd[0]), *cmd[1:]]
        if args.fresh and cmd[0] == "search_efficiency.py":
            full.append("--fresh")
        t = time.perf_counter()
        print(f"== {' '.join(cmd)}", file=sys.stderr, flush=True)
        p = subprocess.run(full, cwd=ROOT, capture_output=True, text=True)
        dt = time.perf_counter() - t
        out = (p.stdout + ("\n" + p.stderr if p.returncode else "")).strip()
        sections.append((title, " ".join(["python", "benchmarks/" + cmd[0], *cmd[1:]]), dt, p.returncode, out))
        print(out, file=sys.stderr)
    total = time.perf_counter() - t_all
    md = [
        "# Benchmark results",
        "",
        "Regenerate everything (this page included) with one command:",
        "",
        "```",
        "python benchmarks/run_all.py",
        "```",
        "",
        f"Machine: {machine()}. Total wall time of this run: {total / 60:.1f} min. "
        f"Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        "Analysis of what these numbers mean, and where targets are missed, is in the section at the end.",
        "",
        "![capacity vs engine launches, one line per strategy](results/search_efficiency.png)",
        "",
    ]
    for title, cmd, dt, rc, out in sections:
        md += [f"## {title}", "", f"`{cmd}` ({dt:.0f} s{', FAILED rc=' + str(rc) if rc else ''})", "",
               "```", out, "```", ""]
    analysis = HERE / "ANALYSIS.md"
    if analysis.exists():
        md += [analysis.read_text()]
    (HERE / "RESULTS.md").write_text("\n".join(md))
    print(f"wrote {HERE / 'RESULTS.md'} in {total:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
