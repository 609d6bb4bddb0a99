#!/usr/bin/env bash
# Headless Chromium for the report's rendering test (tests/e2e/test_report_html.py): the test opens the
# generated report.html offline and screenshots it. Debian's package; the test skips with a reason where
# this failed (no root, no network).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  echo "chromium already installed: $(chromium --version 2>/dev/null || true)"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "setup-chromium: not root, cannot apt-get install chromium" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core
chromium --version
