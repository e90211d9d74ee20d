"""The set-up's choice of torch build (scripts/torch_choice.py, used by scripts/setup.sh and the side
environments): the CPU build on a Linux machine without an NVIDIA GPU, the CUDA build with one, and on a machine
whose pip serves PyPI's default torch (the CUDA build) the CPU one is what pip then installs."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "torch_choice.py"
PIN = next(line.strip().strip('",') for line in (REPO / "pyproject.toml").read_text().splitlines()
           if line.strip().startswith('"torch=='))
VERSION = PIN.split("==", 1)[1]


def _choice(tmp: Path, gpu: bool | None, **env: str) -> tuple[list[str], str]:
    """Run the script with a PATH whose nvidia-smi lists a GPU (True), fails (False) or is absent (None)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.unlink(missing_ok=True)
    if gpu is not None:
        smi.write_text("#!/bin/sh\n" + ("echo 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n" if gpu else
                                        "echo 'NVIDIA-SMI has failed' >&2; exit 9\n"))
        smi.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith("SWARMRL_TORCH")}
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60,
                       env={**base, "PATH": f"{bin_dir}:/usr/bin:/bin", **env})
    assert r.returncode == 0, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr  # one line says which build and why
    return r.stdout.split(), r.stderr.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CUDA/CPU choice is Linux's")
def test_the_cpu_build_without_a_gpu_and_the_cuda_build_with_one(tmp_path):
    for gpu in (None, False):
        args, why = _choice(tmp_path, gpu)
        assert args == [f"{PIN}+cpu", "--extra-index-url", "https://download.pytorch.org/whl/cpu"], args
        assert "CPU build" in why and "no NVIDIA GPU" in why
    args, why = _choice(tmp_path, True)
    assert args == [PIN] and "CUDA build" in why and "nvidia-smi" in why
    assert _choice(tmp_path, True, SWARMRL_TORCH="cpu")[0][0] == f"{PIN}+cpu"  # chosen by hand either way
    assert _choice(tmp_path, None, SWARMRL_TORCH="cuda")[0] == [PIN]
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env={**os.environ,
                                                                                          "SWARMRL_TORCH": "rocm"})
    assert r.returncode != 0 and "auto, cpu or cuda" in r.stderr


def _wheel(index: Path, version: str) -> None:
    """A stand-in torch wheel in a PEP 503 index directory (metadata only: pip resolves, never installs it)."""
    d = index / "torch"
    d.mkdir(parents=True, exist_ok=True)
    name = f"torch-{version}-py3-none-any.whl"
    dist = f"torch-{version}.dist-info"
    files = {"torch/__init__.py": b"", f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{k},sha256={base64.urlsafe_b64encode(hashlib.sha256(v).digest()).rstrip(b'=').decode()},{len(v)}\n"
                     for k, v in files.items()) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(d / name, "w") as z:
        for k, v in {**files, f"{dist}/RECORD": record.encode()}.items():
            z.writestr(k, v)
    (d / "index.html").write_text(f'<html><body><a href="{name}">{name}</a></body></html>')


def _resolve(tmp: Path, args: list[str], default: Path) -> str:
    """The torch version pip would install with ``args`` where its index is ``default`` (no pip configuration)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(tmp / "r.json"),
                        "--index-url", default.as_uri(), "--no-deps", "--ignore-installed", *args],
                       capture_output=True, text=True, timeout=120, env={**env, "PIP_CONFIG_FILE": os.devnull})
    assert r.returncode == 0, r.stderr[-2000:]
    [item] = json.loads((tmp / "r.json").read_text())["install"]
    return item["metadata"]["version"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CUDA/CPU choice is Linux's")
def test_where_pip_serves_the_cuda_build_the_setup_installs_the_cpu_one(tmp_path):
    """pip's index holds PyPI's torch (the CUDA build on Linux), the CPU index its +cpu build: the pin as
    scripts/setup.sh ran it before got the CUDA build; the choice for a machine without a GPU gets the CPU one."""
    pypi, cpu = tmp_path / "pypi", tmp_path / "cpu"
    _wheel(pypi, VERSION)
    _wheel(cpu, f"{VERSION}+cpu")
    assert _resolve(tmp_path, [PIN], pypi) == VERSION  # the old set-up: the CUDA build
    args, _ = _choice(tmp_path, None, SWARMRL_TORCH_CPU_INDEX=cpu.as_uri())
    assert _resolve(tmp_path, args, pypi) == f"{VERSION}+cpu"
    args, _ = _choice(tmp_path, True, SWARMRL_TORCH_CPU_INDEX=cpu.as_uri())
    assert _resolve(tmp_path, args, pypi) == VERSION  # with a GPU: PyPI's CUDA build
