#!/usr/bin/env bash
# Optional suite setup: the vLLM Router (PyPI vllm-router, the project extra `fleet`) in the CI venv, for the
# integration test that puts it in front of HTTP-simulator replicas (tests/integration/test_fleet_router.py).
# A failure here only makes that test skip with its reason (.ci/run tolerates it).
set -euo pipefail
[ -f .ci/env ] && sed -i '/TUNER_VLLM_ROUTER=/d' .ci/env
if ! .venv/bin/vllm-router --help >/dev/null 2>&1; then
  .venv/bin/pip install -q -e '.[fleet]'
fi
.venv/bin/vllm-router --help >/dev/null
echo "export TUNER_VLLM_ROUTER=$PWD/.venv/bin/vllm-router" >> .ci/env
