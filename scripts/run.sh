#!/usr/bin/env bash
# Set up (if needed) and run the main job. Extra arguments go to `swarmrl run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/swarmrl run "$@"
