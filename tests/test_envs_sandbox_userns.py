"""The unprivileged path of the sandbox (user namespace, capabilities dropped), run as ``nobody``.

Needs root (to become nobody), ``setpriv`` and unprivileged user namespaces; copies the interpreter's
stdlib to a world-readable temp dir when the installed one is not reachable by other users.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from swarmrl.envs.sandbox import _others_can_run, _python

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, os
from swarmrl.envs.sandbox import run_program, isolation_level, SandboxLimits
L = SandboxLimits(wall_s=1, cpu_s=1, audit_hook=False)
progs = {
    "benign": "print(6*7)",
    "passwd": "print(open('/etc/passwd').read()[:4])",
    "net": "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)\nprint('connected')",
    "remount": "import os\nos.system('mount -o remount,rw /usr 2>/dev/null; touch /usr/swarmrl_pwn')\nprint(os.path.exists('/usr/swarmrl_pwn'))",
    "forks": "import os\nn = 0\nfor i in range(100):\n    try:\n        if os.fork() == 0:\n            import time; time.sleep(5); os._exit(0)\n        n += 1\n    except OSError:\n        break\nprint(n)",
}
out = {"level": isolation_level(), "uid": os.geteuid()}
for k, p in progs.items():
    r = run_program(p, [{"input": ""}], "stdio", L, "namespaces")
    out[k] = [r.error, r.results[0].status, r.results[0].stdout.strip()]
print(json.dumps(out))
"""


def test_unprivileged_user_namespace_path(tmp_path):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run as nobody")
    if subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "unshare", "-Ur", "true"],
                      capture_output=True).returncode != 0:
        pytest.skip("unprivileged user namespaces are not allowed here")
    python = _python()
    if not _others_can_run(python):
        prefix = Path(sys.base_prefix).resolve()
        dst = tmp_path / "py"
        ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
        tar = tmp_path / "py.tar"
        with tarfile.open(tar, "w") as tf:
            def skip(ti):
                return None if any(x in ti.name for x in ("site-packages", "/test/", "__pycache__", "idlelib")) else ti
            tf.add(python, arcname=f"bin/{ver}")
            for lib in (prefix / "lib").glob("libpython*"):
                tf.add(lib, arcname=f"lib/{lib.name}")
            tf.add(prefix / "lib" / ver, arcname=f"lib/{ver}", filter=skip)
        with tarfile.open(tar) as tf:
            tf.extractall(dst)
        for p in [tmp_path, *tmp_path.parents]:
            if p == Path("/"):
                break
            p.chmod(p.stat().st_mode | 0o011)
        subprocess.run(["chmod", "-R", "o+rX", str(dst)], check=True)
        python = str(dst / "bin" / ver)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    res = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", SCRIPT],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["uid"] == 65534 and out["level"] == "namespaces"
    assert out["benign"] == [None, "ok", "42"]
    assert out["passwd"][1] != "ok" and "root" not in out["passwd"][2]
    assert out["net"][1] != "ok" and "connected" not in out["net"][2]
    assert out["remount"][2] == "False" and not Path("/usr/swarmrl_pwn").exists()
    assert out["forks"][0] is None and 0 < int(out["forks"][2]) < 16  # RLIMIT_NPROC inside the namespace
