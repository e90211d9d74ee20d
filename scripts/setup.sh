#!/usr/bin/env bash
# Idempotent set-up: a virtualenv in .venv with the CPU build of torch and swarmrl (editable).
# torch is installed first, pinned to 2.13.0, so no later requirement can pull a CUDA build.
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
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" 2>&1 | quiet
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev,postgres,hivemind,tracking]" 2>&1 | quiet
.venv/bin/python -c "import torch, swarmrl; assert torch.__version__.startswith('2.13.0'), torch.__version__"
compile_package
touch "$stamp"
