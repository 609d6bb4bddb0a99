#!/usr/bin/env bash
# The package as a user installs it: `pip install .` (a wheel, not editable) into a fresh venv, then the
# README's main job from a folder outside the checkout. Catches data files read from the source tree.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q "$repo"
cd "$work"
"$work/venv/bin/tune" --workload "$repo/workloads/chat.jsonl" --slo "$repo/workloads/chat.slo.yaml" \
  --gpu rtx4090 --model qwen2.5-7b --out "$work/runs/chat" 2> "$work/progress.log" || {
  tail -20 "$work/progress.log"; exit 1; }
for f in report.md report.html report.json gate.yaml tuned-config.yaml; do
  test -s "$work/runs/chat/$f" || { echo "wheel check: $f not written"; exit 1; }
done
echo "wheel check: pip install . and the README's main job from $work: report written"
