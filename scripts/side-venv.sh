# Sourced (never run) by the scripts that build an environment beside the project's .venv: setup-trl.sh and
# setup-verifiers.sh. What they share:
#
#   side_venv_init VAR DEFAULT WHAT   PY (python3.11, else python3) and venv (${VAR:-DEFAULT}); refuses the
#                                     project's .venv ("WHAT gets its own environment")
#   quiet, pip                        pip's noise about local index paths filtered out; pip of $venv
#   side_venv_torch NAME              creates $venv if needed, installs torch as setup.sh does (torch_choice.py),
#                                     sets torch_version and writes $venv/swarmrl-NAME-constraints.txt holding torch
#                                     there: nothing installed after it may change torch
# A caller's stamp key hashes this file as well as its own.

side_venv_init() {
  PY=${PYTHON:-python3.11}
  command -v "$PY" >/dev/null 2>&1 || PY=python3
  venv=${!1:-$2}
  if [ "$(realpath -m "$venv")" = "$(realpath -m .venv)" ]; then
    echo "error: $1 is the project's .venv; $3 gets its own environment" >&2
    exit 1
  fi
}

quiet() { grep -v "is ignored" || true; }  # pip's own status still counts (pipefail)
pip() { "$venv/bin/python" -m pip --disable-pip-version-check "$@"; }

side_venv_torch() {
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  "$PY" scripts/torch_choice.py --install "$venv/bin/python" 2>&1 | quiet
  torch_version=$("$venv/bin/python" -W ignore -c 'import torch; print(torch.__version__)' 2>/dev/null)
  echo "torch==$torch_version" >"$venv/swarmrl-$1-constraints.txt"
}
