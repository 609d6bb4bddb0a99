"""Regenerate the results: run the benchmarks, write one dated part per section, assemble the pages.

    python benchmarks/run_all.py                 # the quick default: every `sim` section (--list: their times)
    python benchmarks/run_all.py --long          # and the long simulated ones (search efficiency, the twin
                                                 # against hidden truths, real time vs in-process: 1-2 h)
    python benchmarks/run_all.py --real          # and those on real vLLM (`. .ci/env` first)
    python benchmarks/run_all.py --all           # the whole page: every section a command can regenerate
                                                 # (sim, long and real; `. .ci/env` first; --list: how long)
    python benchmarks/run_all.py --only knee_search,sim_speed
    python benchmarks/run_all.py --fresh         # recompute cached ground truths (search_efficiency's grids)
    python benchmarks/run_all.py --assemble      # rebuild the pages from the part files, running nothing
    python benchmarks/run_all.py --list          # the sections, their kinds and expected wall times
    python benchmarks/run_all.py --record NAME BODY.md --command "..." [--wall-s N] [--measured "..."]

The sections, their commands, kinds, pages and headline figures are in `benchmarks/_parts.py` (how to add
one is said there). Each run writes `benchmarks/results/sections/<name>.md`: the command's stdout under a
header with the date, the commit, the command and its wall time, so every number on the pages was measured
by the run its header names. A section whose command fails keeps its previous part, and the regeneration
page says it failed. Sections not run this time (long, real, record) are included as they were last
measured, with that date. The pages: `benchmarks/RESULTS.md`, the index (one row of headline figures per
section, read from the section), and `benchmarks/results/<page>.md`, the sections in full, the lab notebook,
the analysis and the regeneration log.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _page import (PAGE, RESULTS, ROOT, RUN_SUMMARY, SECTIONS, PartError, assemble,  # noqa: E402
                   code_commit, format_part, full_regeneration_s, part_path, read_runs, stale_pages)
from _parts import KINDS, PARTS, Part, by_name  # noqa: E402


KEEP_RUNS = 24  # invocations kept in results/run_all.json: the last full one and the partial ones after it


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown CPU" where it cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def host() -> str:
    cpu = cpu_model()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = os.getloadavg()[0]
    return (f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, {platform.system()} {platform.machine()}, "
            f"Python {platform.python_version()}, load average {load:.1f} at the start")


def _children_cpu_s() -> float:
    """CPU seconds of finished child processes (theirs and their children's): on a shared host the wall
    time says how busy the host was, the CPU time what the benchmark costs."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def run_part(p: Part, fresh: bool) -> tuple[int, float]:
    """Run one part's command; on success write its part file. Returns (exit code, wall seconds)."""
    argv = [*p.command, *(p.fresh_args if fresh else ())]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    print(f"== {p.name}: python {' '.join(argv)} (expect ~{p.expected_s} s)", file=sys.stderr, flush=True)
    header = {"name": p.name, "measured": now(), "commit": code_commit(),
              "command": "python " + " ".join(argv), "host": host()}
    t, cpu = time.perf_counter(), _children_cpu_s()
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    wall, cpu = time.perf_counter() - t, _children_cpu_s() - cpu
    if proc.returncode:
        print(f"== {p.name} FAILED (rc {proc.returncode}) after {wall:.0f} s; its previous part is kept",
              file=sys.stderr)
        return proc.returncode, wall
    out = proc.stdout.strip("\n")
    body = out if p.markdown else f"```\n{out}\n```"
    header["wall"] = f"{wall:.0f} s wall, {cpu:.0f} s CPU"
    header["host"] += f", {os.getloadavg()[0]:.1f} at the end"  # what the run shared the host with
    part_path(p.name).write_text(format_part(header, body))
    print(out, file=sys.stderr)
    return 0, wall


def record(args: argparse.Namespace) -> int:
    """Stamp a hand-written body as a part: today's date (or --measured), HEAD's commit, the command."""
    name, body_file = args.record
    p = by_name().get(name)
    if p is None:
        print(f"run_all.py: --record: no part named {name!r} in benchmarks/_parts.py", file=sys.stderr)
        return 2
    if not args.command:
        print("run_all.py: --record needs --command (what was run to measure it)", file=sys.stderr)
        return 2
    try:
        body = Path(body_file).read_text()
    except OSError as e:
        print(f"run_all.py: --record: cannot read {body_file}: {e.strerror}", file=sys.stderr)
        return 2
    header = {"name": name, "measured": args.measured or now(), "commit": code_commit(),
              "wall": f"{args.wall_s:.0f} s" if args.wall_s is not None else "not recorded",
              "command": args.command, "host": args.host or host()}
    part_path(name).write_text(format_part(header, body))
    return write_page()


def write_page() -> int:
    """Write the index and every page it links to, and remove the pages an earlier assembly made that this
    one does not; nothing is written when a part cannot be read or a headline figure is not found."""
    try:
        pages = assemble()
    except PartError as e:
        print(f"run_all.py: {e}", file=sys.stderr)
        return 2
    for path, text in pages.items():
        path.write_text(text)
    for path in stale_pages(pages):
        path.unlink()
        print(f"removed {path.relative_to(ROOT)} (no longer assembled)", file=sys.stderr)
    print(f"wrote {PAGE.relative_to(ROOT)} and {len(pages) - 1} pages under "
          f"{RESULTS.relative_to(ROOT)}/", file=sys.stderr)
    return 0


def selected(args: argparse.Namespace) -> list[Part] | str:
    """The parts this invocation runs, or a one-line error."""
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in by_name()]
        if unknown:
            return f"--only: no part named {', '.join(unknown)} (see --list)"
        chosen = [by_name()[n] for n in names]
    else:
        long_, real = args.long or args.all, args.real or args.all
        kinds = {"sim"} | ({"long"} if long_ else set()) | ({"real"} if real else set())
        chosen = [p for p in PARTS if p.kind in kinds]
    recorded = [p.name for p in chosen if p.kind == "record"]
    if recorded:
        return f"--only: {', '.join(recorded)} are recorded by hand (run_all.py --record), not run"
    lacking = sorted({v for p in chosen for v in p.needs if not os.environ.get(v)})
    if lacking:
        return f"{', '.join(lacking)} not set: the real-vLLM sections need `. .ci/env` first"
    return chosen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--long", action="store_true", help="also run the long simulated sections")
    ap.add_argument("--real", action="store_true", help="also run the sections on real vLLM")
    ap.add_argument("--all", action="store_true", help="every section but the hand-recorded ones: the same as "
                    "--long --real")
    ap.add_argument("--only", help="comma-separated part names to run (any kind but record)")
    ap.add_argument("--fresh", action="store_true", help="recompute cached ground truths")
    ap.add_argument("--assemble", action="store_true", help="rebuild the page only")
    ap.add_argument("--list", action="store_true", help="print the sections and their kinds")
    ap.add_argument("--record", nargs=2, metavar=("NAME", "BODY_FILE"))
    ap.add_argument("--command", help="--record: what was run")
    ap.add_argument("--wall-s", type=float, help="--record: its wall time in seconds")
    ap.add_argument("--measured", help="--record: when (default now), starting YYYY-MM-DD")
    ap.add_argument("--host", help="--record: the machine it ran on (default this one)")
    args = ap.parse_args(argv)
    if args.list:
        for p in PARTS:
            print(f"{p.name:24s} {p.kind:6s} ~{p.expected_s / 60:5.1f} min  {p.command_line()}")
        for k in KINDS:
            print(f"total {k}: ~{sum(p.expected_s for p in PARTS if p.kind == k) / 60:.0f} min")
        print(f"run_all.py --all (sim, long, real): ~{full_regeneration_s() / 3600:.1f} h on 2 cores")
        return 0
    if args.record:
        return record(args)
    if args.assemble:
        return write_page()
    chosen = selected(args)
    if isinstance(chosen, str):
        print(f"run_all.py: {chosen}", file=sys.stderr)
        return 2
    SECTIONS.mkdir(parents=True, exist_ok=True)
    t_all, failed, ran = time.perf_counter(), {}, []
    started, commit, machine, cpu0 = now(), code_commit(), host(), _children_cpu_s()
    announced, stopped = False, []
    signal.signal(signal.SIGTERM, _stop)
    try:
        for p in sorted(chosen, key=lambda part: part.timing):  # the timed ones last, together
            if p.timing and not announced:
                print("== timing-sensitive sections from here (their numbers are times)", file=sys.stderr,
                      flush=True)
                announced = True
            rc, _ = run_part(p, args.fresh)
            (failed.__setitem__(p.name, rc) if rc else ran.append(p.name))
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: keep what finished, say what did not run
        stopped = [p.name for p in chosen if p.name not in ran and p.name not in failed]
        print(f"== stopped; not run: {', '.join(stopped)}", file=sys.stderr)
    cmd = "python benchmarks/run_all.py" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    this_run = {"when": started, "commit": commit, "command": cmd, "host": machine, "ran": ran, "failed": failed,
                "stopped": stopped,
                "wall_s": round(time.perf_counter() - t_all, 1), "cpu_s": round(_children_cpu_s() - cpu0, 1)}
    RUN_SUMMARY.write_text(json.dumps((read_runs() + [this_run])[-KEEP_RUNS:], indent=1) + "\n")
    return write_page() or (1 if failed else 0)


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except PartError as e:
        print(f"run_all.py: {e}", file=sys.stderr)
        raise SystemExit(2) from None
