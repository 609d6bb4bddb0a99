"""The README's main job and the twin's whole-space rankings: this tree against an earlier commit, paired.

Issue 36's targets: the main job (the README's first command after install) in at most 30 s on 2 cores,
with the same recommendation as before; the chat space's ranking in at most 10 s and the RAG space's in
at most 20 s on one core. A speed-up measured on a shared 2-core host means something only against the
previous code measured in the same minutes, so both trees run alternated (A B A B ...):

- the main job, whole process (`python -m tuner.cli ...` from each tree's root, each run into a fresh
  `--out`): wall seconds, and user and system CPU seconds as the OS accounts the finished child (what
  `/usr/bin/time` prints); its recommendation line and its "twin ranked N configurations in X s";
- one `Twin.rank` of the chat and the RAG scenario at the nominal twin (before any fit), in a process
  pinned to one core (`sched_setaffinity`, as `taskset -c 0`; `TUNER_TWIN_WORKERS=1`): wall and CPU
  seconds, its top-3, and whether both trees rank the same top-1 and top-3.

The earlier commit (`--base`, default 7943471: the code when issue 36 was filed) is exported with
`git archive` into a temporary folder; this tree is the working tree as it is. Printed: markdown (the
`main_job_speed` part of the results, `benchmarks/results/sections/`), progress on stderr.

    python benchmarks/main_job_speed.py [--base 7943471] [--runs 3] [--rank-runs 1] [--no-rank]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAIN_JOB = ("--workload", "workloads/chat.jsonl", "--slo", "workloads/chat.slo.yaml", "--gpu", "rtx4090",
            "--model", "qwen2.5-7b")
MAX_RUNS = 20  # per tree: 20 main jobs on each tree are already ~30 minutes on 2 cores
RANKED = (("chat-rtx4090", 10.0), ("rag32k-h100", 20.0))  # scenario, target seconds on one core
MAIN_JOB_TARGET_S = 30.0
_VERDICT = re.compile(r"^(recommended \(trial|keep vLLM's defaults).*$", re.M)
_TWIN = re.compile(r"twin ranked (\d+) configurations in ([\d.]+) s")

# Run inside a tree (its own code on sys.path): one Twin.rank at the nominal twin; prints one JSON line.
_RANK = """
import json, resource, sys, time
sys.path.insert(0, "benchmarks")
from _harness import load_settings
from _scenarios import SCENARIOS
from tuner.knobs import Knobs
from tuner.twin.twin import Twin
sc = next(s for s in SCENARIOS if s.name == sys.argv[1])
workload, slo = sc.workload(), sc.slo()
twin = Twin.build(sc.gpu, sc.model, workload, slo, load_settings(sc), seed=0)
choices = {k: list(dict.fromkeys(sc.space.knobs[k].values)) for k in sc.space.knobs}
def cpu():
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime
c0, w0 = cpu(), time.perf_counter()
ranking = twin.rank(choices, lambda k: sc.space.allows(k, {}) is None, extra=[Knobs()])
c1, w1 = cpu(), time.perf_counter()
preds = sorted(((p.capacity_rps or 0.0, str(p.key)) for p in ranking.predictions), reverse=True)
print(json.dumps({"wall": w1 - w0, "cpu": c1 - c0, "configs": len(preds),
                  "top": [[k, round(c, 3)] for c, k in preds[:3]]}))
"""


def _child_cpu() -> tuple[float, float]:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime, ru.ru_stime


def export_tree(commit: str, dest: Path) -> Path:
    """The tree of `commit` (a `git archive` of it) under `dest`."""
    archive = dest / "tree.tar"
    with archive.open("wb") as f:
        subprocess.run(["git", "archive", commit], cwd=ROOT, stdout=f, check=True)
    tree = dest / "tree"
    tree.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    archive.unlink()
    return tree


def _env(tree: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "PYTHONPATH": str(tree), **extra}


def main_job(tree: Path, out: Path) -> dict:
    """One run of the README's main job from `tree`: wall and CPU seconds, its verdict and ranking time."""
    load = os.getloadavg()[0]
    u0, s0 = _child_cpu()
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tuner.cli", *MAIN_JOB, "--out", str(out)], cwd=tree,
                          env=_env(tree), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t0
    u1, s1 = _child_cpu()
    if proc.returncode:
        tail = "\n".join(proc.stdout.splitlines()[-5:])
        raise RuntimeError(f"the main job failed in {tree} (rc {proc.returncode}):\n{tail}")
    verdict = _VERDICT.search(proc.stdout)
    twin = _TWIN.search(proc.stdout)
    return {"wall": wall, "user": u1 - u0, "sys": s1 - s0, "load": load,
            "verdict": verdict.group(0).strip() if verdict else "(no recommendation line)",
            "twin": f"{twin.group(1)} in {twin.group(2)} s" if twin else "-"}


def rank_one_core(tree: Path, scenario: str) -> dict:
    """One Twin.rank of `scenario` from `tree`, pinned to the first usable core."""
    core = min(os.sched_getaffinity(0))
    proc = subprocess.run([sys.executable, "-c", _RANK, scenario], cwd=tree,
                          env=_env(tree, TUNER_TWIN_WORKERS="1"), capture_output=True, text=True,
                          preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    if proc.returncode:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def measure(trees: dict[str, Path], runs: int, rank_runs: int, work: Path) -> dict:
    """Every measurement, alternated between the trees run by run."""
    jobs: dict[str, list[dict]] = {label: [] for label in trees}
    ranks: dict[tuple[str, str], list[dict]] = {}
    for i in range(runs):
        for label, tree in trees.items():
            r = main_job(tree, work / f"out-{label}-{i}")
            jobs[label].append(r)
            _say(f"main job {label} run {i}: {r['wall']:.1f} s wall, {r['user']:.1f} s user; {r['verdict']}")
    for i in range(rank_runs):
        for scenario, _ in RANKED:
            for label, tree in trees.items():
                r = rank_one_core(tree, scenario)
                ranks.setdefault((scenario, label), []).append(r)
                _say(f"rank {scenario} {label} run {i}: {r}")
    return {"jobs": jobs, "ranks": ranks}


def _med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def job_table(jobs: dict[str, list[dict]]) -> list[str]:
    out = ["| tree | wall s: min | median | max | user s (median) | sys s (median) | load average at the starts "
           "| twin ranked |", "|---|---|---|---|---|---|---|---|"]
    for label, rows in jobs.items():
        walls = [r["wall"] for r in rows]
        out.append(f"| {label} | {min(walls):.1f} | {statistics.median(walls):.1f} | {max(walls):.1f} | "
                   f"{_med(rows, 'user'):.1f} | {_med(rows, 'sys'):.1f} | "
                   f"{min(r['load'] for r in rows):.1f}-{max(r['load'] for r in rows):.1f} | "
                   f"{'; '.join(dict.fromkeys(r['twin'] for r in rows))} |")
    return out


def verdicts(jobs: dict[str, list[dict]]) -> list[str]:
    out = []
    for label, rows in jobs.items():
        seen = list(dict.fromkeys(r["verdict"] for r in rows))
        runs = (("the one run" if len(rows) == 1 else f"all {len(rows)} runs") if len(seen) == 1
                else f"{len(seen)} different lines over {len(rows)} runs")
        out += [f"- {label}, {runs}: " + "; ".join(f"`{v}`" for v in seen)]
    a, b = (list(dict.fromkeys(r["verdict"] for r in rows)) for rows in jobs.values())
    out.append(f"- same recommendation on both trees: **{'yes' if a == b else 'no'}**")
    return out


def _knobs(key: str) -> str:
    """A configuration's key (the knobs as JSON) as `name=value` pairs."""
    try:
        return " ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in json.loads(key).items())
    except (ValueError, AttributeError):
        return key


def rank_table(ranks: dict[tuple[str, str], list[dict]], labels: list[str]) -> list[str]:
    out = ["| ranking | tree | configurations | wall s (median) | CPU s (median) | target | top-3 (predicted req/s) |",
           "|---|---|---|---|---|---|---|"]
    for scenario, target in RANKED:
        tops = {}
        for label in labels:
            rows = ranks.get((scenario, label), [])
            ok = [r for r in rows if "error" not in r]
            if not ok:
                err = rows[0]["error"] if rows else "not run"
                out.append(f"| {scenario} | {label} | - | - | - | {target:.0f} s | failed: {err} |")
                continue
            tops[label] = [k for k, _ in ok[0]["top"]]
            top = "; ".join(f"{_knobs(k)} ({c})" for k, c in ok[0]["top"])
            out.append(f"| {scenario} | {label} | {ok[0]['configs']} | {_med(ok, 'wall'):.1f} | "
                       f"{_med(ok, 'cpu'):.1f} | {target:.0f} s | {top} |")
        if len(tops) == 2:
            a, b = tops.values()
            out.append(f"| {scenario} | both | | | | | top-1 {'the same' if a[:1] == b[:1] else 'differs'}, "
                       f"top-3 {len(set(a) & set(b))} of 3 in common |")
    return out


def rank_verdict(ranks: dict[tuple[str, str], list[dict]], this: str) -> str:
    parts = []
    for scenario, target in RANKED:
        ok = [r for r in ranks.get((scenario, this), []) if "error" not in r]
        if not ok:
            parts.append(f"{scenario} not measured")
            continue
        wall = _med(ok, "wall")
        parts.append(f"{scenario} {wall:.1f} s (target {target:.0f} s: {'met' if wall <= target else 'not met'})")
    return f"**The rankings on one core, this tree (median wall): {'; '.join(parts)}.**"


def report(result: dict, labels: list[str], base: str, runs: int, rank_runs: int) -> str:
    jobs = result["jobs"]
    med = {label: statistics.median(r["wall"] for r in rows) for label, rows in jobs.items()}
    this, before = labels
    md = [f"The README's main job (`python -m tuner.cli {' '.join(MAIN_JOB)} --out ...`), this tree and "
          f"`{base}` alternated, {runs} run{'s' if runs > 1 else ''} each, whole process; then one `Twin.rank` "
          f"per scenario and tree pinned to one core, {rank_runs} run{'s' if rank_runs > 1 else ''} each "
          f"(`python benchmarks/main_job_speed.py --base {base} --runs {runs} --rank-runs {rank_runs}`).", "",
          f"**The main job: {med[this]:.1f} s on this tree (median; target {MAIN_JOB_TARGET_S:.0f} s: "
          f"{'met' if med[this] <= MAIN_JOB_TARGET_S else 'not met'}), {med[before]:.1f} s on `{base}`: "
          f"ratio {med[this] / med[before]:.2f}.**", ""]
    md += job_table(jobs) + ["", "Recommendations:"] + verdicts(jobs) + [""]
    if result["ranks"]:
        md += [rank_verdict(result["ranks"], this), ""] + rank_table(result["ranks"], labels) + [""]
    return "\n".join(md)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="7943471", help="the earlier commit to pair against (default 7943471)")
    ap.add_argument("--runs", type=int, default=3, help="main-job runs per tree (default 3)")
    ap.add_argument("--rank-runs", type=int, default=1, help="one-core rankings per scenario and tree (default 1)")
    ap.add_argument("--no-rank", action="store_true", help="skip the one-core rankings")
    a = ap.parse_args(argv)
    if not (1 <= a.runs <= MAX_RUNS and 1 <= a.rank_runs <= MAX_RUNS):  # 99999999 runs would run for ever
        print(f"main_job_speed.py: --runs and --rank-runs must be 1 to {MAX_RUNS}", file=sys.stderr)
        return 2
    rev = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{a.base}^{{commit}}"], cwd=ROOT,
                         capture_output=True, text=True)
    if rev.returncode:
        print(f"main_job_speed.py: --base: {a.base!r} is not a commit of this repository", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="main-job-speed-") as tmp:
        work = Path(tmp)
        trees = {"this tree": ROOT, a.base: export_tree(a.base, work)}
        try:
            result = measure(trees, a.runs, 0 if a.no_rank else a.rank_runs, work)
        except RuntimeError as e:
            print(f"main_job_speed.py: {e}", file=sys.stderr)
            return 1
    print(report(result, list(trees), a.base, a.runs, a.rank_runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
