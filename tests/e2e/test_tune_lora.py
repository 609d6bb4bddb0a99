"""Issue 37 on the simulator: Qwen2.5-7B on an RTX 4090 serving 100 rank-16 LoRA adapters (Zipf alpha 1.0)
under p99 TTFT <= 500 ms. vLLM's defaults (one adapter slot) thrash; the diagnosis names adapter slots with
its evidence; more slots and a CPU cache for the long tail raise the capacity; the report carries the
cold decile's p99 TTFT. A workload of one adapter gets no LoRA knob. Bad LoRA inputs: one line, exit 2,
nothing created."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
W, SLO, CAT = (ROOT / "workloads" / f"multitenant-lora{s}" for s in (".jsonl", ".slo.yaml", ".adapters.yaml"))


def tune(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_adapter_thrash_is_diagnosed_and_more_slots_answer_it(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("knobs:\n  max_loras: {values: [1, 16]}\n  max_cpu_loras: {values: [null, 128]}\n")
    out = tmp_path / "run"
    p = tune("--workload", str(W), "--slo", str(SLO), "--lora-dir", str(CAT), "--search-space", str(space),
             "--gpu", "rtx4090", "--model", "qwen2.5-7b", "--strategy", "grid", "--no-confirm", "--out", str(out),
             cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rep = json.loads((out / "report.json").read_text())
    trials = {json.dumps(t.get("knobs") or {}, sort_keys=True): t for t in rep["trials"]}
    base = trials["{}"]
    assert base["diagnosis"]["kind"] == "adapter_slots", base["diagnosis"]
    ev = base["diagnosis"]["evidence"]
    assert ev["max_lora"] == 1 and ev["waiting_lora_adapters_p90"] >= 1 and ev["adapter_loads"] > 0
    best = trials['{"max_cpu_loras": 128, "max_loras": 16}']
    assert (best["capacity_rps"] or 0) > (base["capacity_rps"] or 0)
    assert "max-loras: 16" in (out / "tuned-config.yaml").read_text()  # the --config YAML carries it
    lora = rep["lora"]["rows"]  # the cold decile's p99 TTFT before (the defaults) and after
    before = next(r for r in lora if r["knobs"] == "vLLM defaults")
    after = next(r for r in lora if r["knobs"] == "max_loras=16, max_cpu_loras=128")
    # each row is its trial's own run (its knee, or its lowest rate where none passed): the defaults fail even
    # their lowest rate, the 16 slots pass a rate many times higher, both deciles measured
    assert not before["passed"] and after["passed"] and after["rate"] > 5 * before["rate"]
    assert min(before["hot_attainment"], before["cold_attainment"]) < 0.99 and after["cold_p99_ttft_ms"] is not None
    assert "LoRA adapters: the hot and the cold tenants" in (out / "report.md").read_text()


def test_the_default_strategy_follows_the_diagnosis_when_the_defaults_meet_the_slo_at_no_rate(tmp_path: Path) -> None:
    """Issue 57: vLLM's defaults (one adapter slot) meet the SLO at no rate, which leaves the twin no knee to
    fit; the default strategy hands the study to the diagnosis, whose first knob is the adapter slots, and
    the baseline's "no" names them (not only the requests' long prompts)."""
    out = tmp_path / "run"
    p = tune("--workload", str(W), "--slo", str(SLO), "--lora-dir", str(CAT), "--search-space", "multitenant-lora",
             "--gpu", "rtx4090", "--model", "qwen2.5-7b", "--max-trials", "3", "--out", str(out), cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "(the diagnosis led: the baseline met the SLO at no rate)" in p.stdout, p.stdout[-3000:]
    rep = json.loads((out / "report.json").read_text())
    base = rep["baseline"]
    assert base["capacity_rps"] is None and "wait for adapter slots" in base["no_capacity_reason"]
    assert "Raise max_loras" in base["no_capacity_reason"]
    r = rep["recommendation"]
    assert r["kind"] == "tuned" and r["knobs"].get("max_loras", 1) > 1 and r["capacity_rps"] > 0


def test_one_adapter_gets_no_lora_knob(tmp_path: Path) -> None:
    w = tmp_path / "one.jsonl"
    w.write_text("".join(json.dumps({"prompt_tokens": 200, "output_tokens": 20, "model": "lora-000"}) + "\n"
                         for _ in range(300)))
    out = tmp_path / "run"
    p = tune("--workload", str(w), "--slo", str(SLO), "--lora-dir", str(CAT), "--search-space", "multitenant-lora",
             "--gpu", "rtx4090", "--model", "qwen2.5-7b", "--max-trials", "1", "--no-confirm", "--out", str(out),
             cwd=tmp_path)
    assert "max_loras, max_cpu_loras left out of the search" in p.stderr, p.stderr[-2000:]


BAD = [
    ("no-config", "adapter folder without adapter_config.json"),
    ("rank", "below the largest adapter's rank (32)"),
    ("dup", "two adapters named 'a'"),
    ("unknown", "names adapter 'zed', which is not in --lora-dir"),
    ("cpu", "vLLM requires max_cpu_loras >= max_loras"),
    ("rank-vs-weights", "r: is 16 but the weights in adapter_model.safetensors are rank 8"),
]


@pytest.mark.parametrize("case,expected", BAD)
def test_bad_lora_inputs(tmp_path: Path, case: str, expected: str) -> None:
    (tmp_path / "w.jsonl").write_text("".join(json.dumps({"prompt_tokens": 50, "output_tokens": 5,
                                                          "model": m}) + "\n" for m in ("a", "b", "a")))
    (tmp_path / "cat.yaml").write_text("rank: 16\nadapters: [a, b]\n")
    (tmp_path / "space.yaml").write_text("knobs:\n  max_loras: {values: [1, 2]}\n")
    lora_dir = "cat.yaml"
    if case == "no-config":
        (tmp_path / "ads" / "a").mkdir(parents=True)
        lora_dir = "ads"
    elif case == "rank":
        (tmp_path / "cat.yaml").write_text("adapters: [{name: a, rank: 32}, b]\n")
        (tmp_path / "space.yaml").write_text("knobs:\n  max_lora_rank: {values: [16, 32]}\n")
    elif case == "dup":
        (tmp_path / "cat.yaml").write_text("adapters: [a, b, a]\n")
    elif case == "unknown":
        (tmp_path / "w.jsonl").write_text(json.dumps({"prompt_tokens": 5, "output_tokens": 5, "model": "zed"}) + "\n")
    elif case == "rank-vs-weights":  # a PEFT folder whose config says r=16 over rank-8 weights
        for name in ("a", "b"):
            d = tmp_path / "ads" / name
            d.mkdir(parents=True)
            (d / "adapter_config.json").write_text(json.dumps({"r": 16, "target_modules": ["q_proj"]}))
            head = json.dumps({"m.q_proj.lora_A.weight": {"dtype": "F32", "shape": [8, 4], "data_offsets": [0, 128]},
                               "m.q_proj.lora_B.weight": {"dtype": "F32", "shape": [4, 8], "data_offsets": [128, 256]}})
            (d / "adapter_model.safetensors").write_bytes(len(head).to_bytes(8, "little") + head.encode() + bytes(256))
        lora_dir = "ads"
    elif case == "cpu":
        (tmp_path / "space.yaml").write_text("knobs:\n  max_loras: {values: [4, 8]}\n"
                                             "  max_cpu_loras: {values: [2, 16]}\n")
    (tmp_path / "slo.yaml").write_text("ttft: {max_ms: 500, percentile: 99}\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    p = tune("--workload", "w.jsonl", "--slo", "slo.yaml", "--lora-dir", lora_dir, "--search-space", "space.yaml",
             "--gpu", "rtx4090", "--model", "qwen2.5-7b", "--out", "run", cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in p.stderr, p.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing created
