#!/usr/bin/env bash
# Idempotent set-up of an environment with the optional `verifiers` extra (vf:<env_id> tasks, docs/environments.md),
# never the project's .venv: verifiers 0.4.0 pulls ~30 packages (openai, anthropic, mcp, prime-*, renderers, ...)
# that the default install keeps out.
#
#   SWARMRL_VF_VENV   the environment (default: .venv-verifiers in the checkout, ignored by git)
#
# What goes in, read from pyproject.toml: torch (its pin, the CPU build as scripts/setup.sh installs it) first; then,
# in one resolve with torch held at what was installed, swarmrl's own dependencies (torch aside), the `verifiers`
# extra and pytest/pytest-timeout/hypothesis from `dev`. swarmrl itself is not installed: run it from the checkout
# with PYTHONPATH (`SWARMRL_REQUIRE_VERIFIERS=1 PYTHONPATH=$PWD .venv-verifiers/bin/python -m pytest -m verifiers
# tests/test_envs_vf.py`). A re-run with the same requirements (and this script unchanged) does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/side-venv.sh
side_venv_init SWARMRL_VF_VENV .venv-verifiers "the verifiers extra"

# line 1: torch's pin; the rest: what is resolved together with verifiers
spec=$("$PY" scripts/extra_requirements.py verifiers pytest pytest-timeout hypothesis)
torch_pin=$(head -n 1 <<<"$spec")
key=$( (printf '%s\n' "$spec"; "$PY" -c 'import sys; print(sys.version)'; cat scripts/setup-verifiers.sh scripts/side-venv.sh) | sha256sum | cut -c1-16)
stamp=$venv/.swarmrl-verifiers-installed
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$key" ]; then
  exit 0
fi

side_venv_torch verifiers  # nothing below may change torch
tail -n +2 <<<"$spec" >"$venv/swarmrl-verifiers-requirements.txt"
pip install -q -c "$venv/swarmrl-verifiers-constraints.txt" -r "$venv/swarmrl-verifiers-requirements.txt" 2>&1 | quiet

PYTHONPATH=$PWD "$venv/bin/python" - "$torch_version" <<'PYEOF'
import sys
import torch, verifiers.v1  # noqa: F401
import swarmrl.episodes.vf, swarmrl.inference.openai_server  # noqa: F401
from importlib.metadata import version
if torch.__version__ != sys.argv[1]:
    sys.exit(f"error: torch is {torch.__version__} after installing verifiers, not {sys.argv[1]}")
print(f"setup-verifiers: verifiers {version('verifiers')}, torch {torch.__version__}")
PYEOF
echo "$key" >"$stamp"
