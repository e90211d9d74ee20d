#!/usr/bin/env bash
# Idempotent set-up: a virtualenv in .venv with torch and swarmrl (editable). torch is installed first, at
# pyproject.toml's pin, in the build scripts/torch_choice.py picks for this machine (the CPU build unless an NVIDIA
# GPU answers nvidia-smi; SWARMRL_TORCH=cpu|cuda to choose), so no later requirement can pull another one.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
stamp=.venv/.swarmrl-installed
# The package's own bytecode, as a regular (non-editable) pip install leaves it: where PYTHONDONTWRITEBYTECODE is
# set, Python never writes it and every command compiled swarmrl's modules from source again (~20-30 ms of each
# CLI start here). Only sources newer than their .pyc are compiled (~0.1 s when nothing changed).
compile_package() { .venv/bin/python -m compileall -q -j 0 swarmrl >/dev/null; }
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then
  compile_package
  exit 0
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
quiet() { grep -v "is ignored" || true; }  # drop pip's noise about local index paths; pip's own status still counts
mapfile -t torch_args < <(.venv/bin/python scripts/torch_choice.py 2>/dev/null)
.venv/bin/python scripts/torch_choice.py --install .venv/bin/python 2>&1 | quiet  # says which build, and why
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev,postgres,hivemind,tracking]" 2>&1 | quiet
.venv/bin/python - "${torch_args[0]}" <<'EOF'
import sys, torch, swarmrl
want = sys.argv[1].split("==", 1)[1]
assert torch.__version__ == want or (torch.__version__.split("+")[0] == want and "+cpu" not in want), (torch.__version__, want)
EOF
compile_package
touch "$stamp"
