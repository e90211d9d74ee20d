#!/usr/bin/env bash
# Install Debian's chromium (apt-get) for the dashboard's browser test (tests/test_dashboard_browser.py, which
# skips without it). Needs root. Idempotent: does nothing when chromium is already on PATH.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
echo "[ci-chromium] installing chromium with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq chromium >&2
