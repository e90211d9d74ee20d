"""The code sandbox fails closed: without kernel namespaces, or when the seccomp filter cannot be installed, no
untrusted program runs and code tasks are refused with a clear error, unless a setting explicitly accepts the
weaker isolation (``isolation = "auto"`` / ``"fallback"``, ``require_seccomp = false``). The seccomp filter is
in place in the fallback too. ``python -m swarmrl.envs.sandbox_check --expect LEVEL`` prints what this machine gives
and fails when it is less (CI runs it)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from swarmrl.envs import sandbox
from swarmrl.envs.code import CodeEnv
from swarmrl.envs.sandbox import SandboxLimits, expectation_problems, run_program, sandbox_status

# the fallback here runs as root behind the audit hook (the interpreter lives under /root): its warning is expected
pytestmark = pytest.mark.filterwarnings("ignore:code sandbox:RuntimeWarning")

REPO = Path(__file__).resolve().parents[1]
FAST = SandboxLimits(wall_s=2.0, cpu_s=2)
CASE = [{"input": ""}]


@pytest.fixture
def no_namespaces(monkeypatch):
    """This machine as one without kernel namespaces (what the probe would have found there)."""
    monkeypatch.setattr(sandbox, "_status", {"isolation": "fallback", "seccomp": True,
                                             "error": "unshare: Operation not permitted"})


@pytest.fixture
def no_seccomp(monkeypatch, tmp_path):
    """A harness whose seccomp filter does not install (a kernel without seccomp, an unsupported architecture)."""
    src = sandbox._HARNESS.read_text()
    marker = "def install_seccomp():\n"
    assert marker in src
    harness = tmp_path / "harness_without_seccomp.py"
    harness.write_text(src.replace(marker, marker + '    return "seccomp: not in this kernel (test)"\n', 1))
    harness.chmod(0o644)
    monkeypatch.setattr(sandbox, "_HARNESS", harness)
    status = {**sandbox_status(), "seccomp": False}
    monkeypatch.setattr(sandbox, "_status", status)


def test_without_namespaces_no_program_runs_unless_weaker_isolation_is_chosen(no_namespaces):
    run = run_program("print('ran')", CASE, "stdio", FAST)  # the default: namespaces, or nothing
    assert run.error is not None and run.internal and "namespaces" in run.error and "fallback" in run.error
    assert all(r.status == "error" and not r.stdout for r in run.results)
    with pytest.raises(RuntimeError, match="namespace"):
        CodeEnv()  # code tasks are refused at once, not scored 0 one by one
    run = run_program("print('ran')", CASE, "stdio", FAST, isolation="auto")  # said explicitly: the fallback
    assert run.error is None and run.isolation == "fallback" and run.results[0].stdout.strip() == "ran"
    assert CodeEnv(isolation="auto").isolation == "auto"


def test_without_seccomp_no_program_runs_unless_allowed(no_seccomp):
    run = run_program("print('ran')", CASE, "stdio", FAST, isolation=sandbox_status()["isolation"])
    assert run.error is not None and run.internal and "seccomp" in run.error
    assert not any(r.stdout for r in run.results)
    with pytest.raises(RuntimeError, match="seccomp"):
        CodeEnv()
    weaker = SandboxLimits(wall_s=2.0, cpu_s=2, require_seccomp=False)
    run = run_program("print('ran')", CASE, "stdio", weaker, isolation=sandbox_status()["isolation"])
    assert run.error is None and not run.seccomp and run.results[0].stdout.strip() == "ran"
    assert CodeEnv(require_seccomp=False, isolation="auto").limits.require_seccomp is False


@pytest.mark.skipif(not sandbox_status()["seccomp"], reason="the seccomp filter does not install here")
def test_the_seccomp_filter_holds_in_the_fallback():
    """chroot raises no audit event, so only the filter stands between it and the kernel here (as a fresh uid it
    would fail with EPERM, as root it would succeed)."""
    run = run_program("import os\nos.chroot('/')\nprint('chrooted')", CASE, "stdio", FAST, isolation="fallback")
    assert run.error is None and run.isolation == "fallback" and run.seccomp
    r = run.results[0]
    assert r.status == "signal" and r.code == signal.SIGSYS and r.denied_syscall and "chrooted" not in r.stdout
    ok = run_program("print(6 * 7)", CASE, "stdio", FAST, isolation="fallback")
    assert ok.seccomp and ok.results[0].stdout.strip() == "42"  # the filter lets ordinary programs be


def _expect(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "swarmrl.envs.sandbox_check", *argv], capture_output=True, text=True,
                          cwd=REPO, timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})


def test_the_isolation_check_ci_runs_prints_the_level_and_fails_below_the_expected_one():
    here = sandbox_status()
    r = _expect("--expect", here["isolation"])
    got = json.loads(r.stdout)
    assert got["isolation"] == here["isolation"] and got["seccomp"] == here["seccomp"]
    assert r.returncode == (0 if here["seccomp"] else 1), r.stderr
    # what it compares: a level below the expected one, or no seccomp filter, is a failure; more is fine
    assert expectation_problems({"isolation": "fallback", "seccomp": True}, "namespaces")
    assert expectation_problems({"isolation": "namespaces", "seccomp": False}, "namespaces")
    assert expectation_problems({"isolation": "namespaces", "seccomp": True}, "fallback") == []
    assert expectation_problems({"isolation": "namespaces", "seccomp": True}, "namespaces") == []
