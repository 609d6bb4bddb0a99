"""The HTTP simulator serving LoRA adapters, as a real subprocess on 127.0.0.1: `/v1/models` lists them with
the base model as parent, a request names one in `model`, an unknown one is vLLM's 404, and `/metrics`
exports `vllm:lora_requests_info` as vLLM does (value: a wall-clock time; labels max_lora and the
comma-joined running and waiting adapters)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_sim_server import sim_server




def _adapter(root: Path, name: str, rank: int) -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "adapter_config.json").write_text(json.dumps({"r": rank, "target_modules": ["q_proj", "v_proj"]}))
    (d / "adapter_model.safetensors").write_bytes(b"\x02" + b"\0" * 7 + b"{}" + b"\0" * 1014)  # an empty safetensors


def test_adapters_are_served_listed_and_reported(tmp_path: Path) -> None:
    catalog = tmp_path / "cat.yaml"
    catalog.write_text("rank: 16\nadapters: [a, b, c]\n")
    _adapter(tmp_path / "ads", "folder-one", 8)
    with sim_server("--enable-lora", "--lora-dir", str(catalog), "--lora-modules",
                    f"tuned={tmp_path / 'ads' / 'folder-one'}", "--max-loras", "2") as (base, _log):
        models = httpx.get(f"{base}/v1/models").json()["data"]
        ids = [m["id"] for m in models]
        assert ids[1:] == ["a", "b", "c", "tuned"] and all(m["parent"] == ids[0] for m in models[1:])
        assert models[-1]["root"].endswith("folder-one")
        # three adapters at once on two slots: one waits while the others run
        with httpx.Client(timeout=60) as c:
            done = []
            ts = [threading.Thread(target=lambda m=m: done.append(c.post(f"{base}/v1/completions", json={
                "model": m, "prompt": "hello " * 50, "max_tokens": 200}).status_code)) for m in ("a", "b", "c")]
            for t in ts:
                t.start()
            deadline = time.monotonic() + 20  # until all three arrived (a busy host may be slow to send)
            while True:
                text = httpx.get(f"{base}/metrics").text
                if 'reason="deferred"} 1.0' in text or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            for t in ts:
                t.join()
        assert done == [200, 200, 200]
        info = [s for f in text_string_to_metric_families(text) if f.name == "vllm:lora_requests_info"
                for s in f.samples]
        assert len(info) == 1 and info[0].labels["max_lora"] == "2"
        assert abs(info[0].value - time.time()) < 120  # a timestamp, not a count
        running = [a for a in info[0].labels["running_lora_adapters"].split(",") if a]
        assert len(running) == 2  # both slots taken: the third adapter's request is deferred
        assert set(running) <= set(info[0].labels["waiting_lora_adapters"].split(","))  # as vLLM 0.32 lists them
        reasons = {s.labels["reason"]: s.value for f in text_string_to_metric_families(text)
                   if f.name == "vllm:num_requests_waiting_by_reason" for s in f.samples}
        assert reasons["deferred"] == 1
        r = httpx.post(f"{base}/v1/completions", json={"model": "nope", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 404
