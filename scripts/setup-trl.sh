#!/usr/bin/env bash
# Idempotent set-up of TRL's own environment for the peer benchmark (benchmarks/rl/vs_trl.py runs TRL's
# GRPOTrainer through benchmarks/rl/trl_grpo.py in it). The project never depends on TRL: it lives here only.
#
#   SWARMRL_TRL_VENV   the environment (default: .venv-trl in the checkout, ignored by git)
#
# What goes in: torch at the project's pin (the CPU build, as scripts/setup.sh installs it) first; then TRL at the
# pin below with torch held where it is (a TRL that wanted another torch fails here instead of pulling the CUDA
# build), and pydantic (the benchmark imports swarmrl.envs from the checkout for the task and its verifier).
set -euo pipefail
cd "$(dirname "$0")/.."
TRL_PIN="trl==1.16.0"
source scripts/side-venv.sh
side_venv_init SWARMRL_TRL_VENV .venv-trl TRL
torch_pin=$("$PY" scripts/extra_requirements.py dev | head -n 1)
key=$( (echo "$torch_pin $TRL_PIN"; "$PY" -c 'import sys; print(sys.version)'; cat scripts/setup-trl.sh scripts/side-venv.sh) \
  | sha256sum | cut -c1-16)
stamp=$venv/.swarmrl-trl-installed
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$key" ]; then
  exit 0
fi
side_venv_torch trl
pip install -q -c "$venv/swarmrl-trl-constraints.txt" "$TRL_PIN" pydantic 2>&1 | quiet
PYTHONPATH=$PWD "$venv/bin/python" -W ignore - "$torch_version" <<'PYEOF'
import sys
import torch, trl  # noqa: F401
import swarmrl.envs  # noqa: F401
if torch.__version__ != sys.argv[1]:
    sys.exit(f"error: torch is {torch.__version__} after installing TRL, not {sys.argv[1]}")
print(f"setup-trl: trl {trl.__version__}, torch {torch.__version__}")
PYEOF
echo "$key" >"$stamp"
