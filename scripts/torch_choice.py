"""Which build of torch this machine's environments get: the pip arguments that install it (stdout, one per
line) and why (stderr, one line). The version is pyproject.toml's pin (``torch==X``).

    python scripts/torch_choice.py                    # SWARMRL_TORCH = auto (default) | cpu | cuda
    python scripts/torch_choice.py --install PYTHON   # and install it into PYTHON's environment

auto: on Linux, the CUDA build (PyPI's default there) where an NVIDIA GPU answers ``nvidia-smi -L``, else the CPU
build: ``torch==X+cpu`` from PyTorch's CPU wheel index (SWARMRL_TORCH_CPU_INDEX, added to pip's own indexes, so
a mirror or a local wheel directory that holds it serves it too). A plain ``torch==X`` from PyPI on a machine
without a GPU would be the multi-GB CUDA build, and scripts/setup-vllm.sh needs the CPU one. Elsewhere (macOS,
Windows) PyPI's build is the CPU one: the pin as it is.

``--install`` fetches torch alone from the chosen index (``--no-deps``), then its dependencies from pip's own
indexes: only the torch wheel comes from PyTorch's index (an unreachable one then costs one request's retries,
not one per dependency).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def torch_pin(pyproject: Path) -> str:
    with open(pyproject, "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    pins = [d for d in deps if re.match(r"torch\s*==", d)]
    if len(pins) != 1:
        sys.exit("error: pyproject.toml must pin torch exactly once (torch==X)")
    return re.sub(r"\s", "", pins[0])


def nvidia_gpu() -> bool:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return False
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def choose(pin: str, want: str, linux: bool, gpu: bool, cpu_index: str) -> tuple[list[str], str]:
    """(pip arguments, the one line that says which build and why)."""
    version = pin.split("==", 1)[1]
    if not linux:
        return [pin], f"torch {version}: PyPI's build for this platform (CPU)"
    how = "SWARMRL_TORCH=" + want if want != "auto" else ("an NVIDIA GPU answers nvidia-smi" if gpu else
                                                          "no NVIDIA GPU found")
    if want == "cuda" or (want == "auto" and gpu):
        return [pin], f"torch {version}: the CUDA build ({how}; SWARMRL_TORCH=cpu for the CPU one)"
    return ([f"torch=={version}+cpu", "--extra-index-url", cpu_index],
            f"torch {version}: the CPU build from {cpu_index} ({how}; SWARMRL_TORCH=cuda for the CUDA one)")


def install(python: str, args: list[str]) -> None:
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    for cmd in (pip + ["--no-deps", *args], pip + [args[0]]):  # torch, then its dependencies from pip's indexes
        r = subprocess.run(cmd)
        if r.returncode != 0:
            sys.exit(f"error: {' '.join(cmd)} failed ({r.returncode})")


def main() -> None:
    if len(sys.argv) not in (1, 3) or (len(sys.argv) == 3 and sys.argv[1] != "--install"):
        sys.exit(__doc__)
    want = os.environ.get("SWARMRL_TORCH", "auto") or "auto"
    if want not in ("auto", "cpu", "cuda"):
        sys.exit(f"error: SWARMRL_TORCH={want!r}: auto, cpu or cuda")
    linux = sys.platform.startswith("linux")
    args, why = choose(torch_pin(Path(__file__).resolve().parents[1] / "pyproject.toml"), want, linux,
                       linux and want == "auto" and nvidia_gpu(), os.environ.get("SWARMRL_TORCH_CPU_INDEX", CPU_INDEX))
    print(why, file=sys.stderr)
    if len(sys.argv) == 3:
        install(sys.argv[2], args)
    else:
        print("\n".join(args))


if __name__ == "__main__":
    main()
