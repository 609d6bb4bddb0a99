#!/usr/bin/env bash
# The package as a user installs it: `pip install .` (a wheel, not editable) into a fresh venv, then the
# README's main job from a folder outside the checkout, and a short RAG study whose `--search-space rag`
# must resolve to the search space the wheel ships (the top-level search_spaces/, mapped into the
# package by setup.py), not to the checkout's copy. Catches data files read from the source tree.
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
shipped="$("$work/venv/bin/python" -c 'from tuner.search.space import BUILTIN_DIR; print(BUILTIN_DIR / "rag.yaml")')"
case "$shipped" in
  "$work/venv/"*) test -s "$shipped" || { echo "wheel check: $shipped is not shipped"; exit 1; } ;;
  *) echo "wheel check: --search-space rag resolves to $shipped, outside the installed wheel"; exit 1 ;;
esac
# 4: launched, nothing met the RAG SLO on an RTX 4090 in two trials (the study itself ran on the space)
rc=0
"$work/venv/bin/tune" --workload "$repo/workloads/rag.jsonl" --slo "$repo/workloads/rag.slo.yaml" \
  --gpu rtx4090 --model qwen2.5-7b --search-space rag --strategy guided --max-trials 2 --no-confirm \
  --out "$work/runs/rag" 2> "$work/rag.log" || rc=$?
[ "$rc" = 0 ] || [ "$rc" = 4 ] || { tail -20 "$work/rag.log"; exit 1; }
test -s "$work/runs/rag/report.md" || { echo "wheel check: the rag study wrote no report"; exit 1; }
echo "wheel check: pip install . and the README's main job from $work: report written; --search-space rag"
echo "  read the shipped $shipped"
