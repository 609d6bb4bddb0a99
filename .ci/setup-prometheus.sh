#!/usr/bin/env bash
# Optional suite setup: a real Prometheus server (Debian package) for the slow test that reads a load
# run's metrics back from Prometheus (tests/integration/test_replay_prometheus.py). A failure here only
# makes that test skip with its reason (.ci/run tolerates it).
set -euo pipefail
if command -v prometheus >/dev/null 2>&1; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
# The package enables a system service; the test starts its own server on a free port instead.
command -v systemctl >/dev/null 2>&1 && systemctl disable --now prometheus >/dev/null 2>&1 || true
prometheus --version | head -1
