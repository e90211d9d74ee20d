"""Hostile programs against the code sandbox: each attack, if it worked, would print the expected
output (so reward would be 1); the sandbox must make it fail and leave the host untouched."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from swarmrl.envs.base import Task
from swarmrl.envs.code import CodeEnv
from swarmrl.envs.sandbox import _UID_BASE, _UID_SPAN, SandboxLimits, isolation_level, run_program

# the fallback here runs as root behind the audit hook only (the interpreter lives under /root); that is
# exactly the layer these tests exercise, so its warning is expected
pytestmark = pytest.mark.filterwarnings("ignore:code sandbox:RuntimeWarning")

PROJECT_FILE = Path(__file__).resolve().parents[1] / "swarmrl" / "envs" / "base.py"
FAST = dict(wall_s=1.0, cpu_s=1)

CONFIGS = [("namespaces", True), ("namespaces", False), ("fallback", True)]


def _params():
    out = []
    for iso, audit in CONFIGS:
        marks = []
        if iso == "namespaces":
            marks.append(pytest.mark.skipif(isolation_level() != "namespaces", reason="no namespaces here"))
        out.append(pytest.param(iso, audit, id=f"{iso}-{'audit' if audit else 'kernel-only'}", marks=marks))
    return out


def run1(program: str, iso: str, audit: bool, stdin: str = "", **lim):
    limits = SandboxLimits(audit_hook=audit, **{**FAST, **lim})
    run = run_program(program, [{"input": stdin}], "stdio", limits, iso)
    assert run.error is None, run.error
    assert run.isolation == iso
    return run.results[0]


def sandbox_procs() -> list[int]:
    """Host pids owned by any sandbox uid."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            for line in (d / "status").read_text().splitlines():
                if line.startswith("Uid:"):
                    uid = int(line.split()[1])
                    if _UID_BASE <= uid < _UID_BASE + _UID_SPAN:
                        pids.append(int(d.name))
        except OSError:
            continue
    return pids


def test_isolation_level_reported():
    assert isolation_level() in ("namespaces", "fallback")
    if os.geteuid() == 0 and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0:
        assert isolation_level() == "namespaces"


@pytest.mark.parametrize("iso,audit", _params())
def test_benign_program_runs(iso, audit):
    r = run1("import sys\nprint(sum(map(int, sys.stdin.read().split())))", iso, audit, stdin="1 2 3\n")
    assert r.status == "ok" and r.completed and r.stdout.strip() == "6"


@pytest.mark.parametrize("iso,audit", _params())
def test_exit_builtins_and_stdin_buffer(iso, audit):
    r = run1("import sys\ndata = sys.stdin.buffer.read()\nprint(len(data))\nexit()\nprint('unreached')", iso, audit,
             stdin="abc")
    assert r.status == "ok" and r.completed and r.stdout == "3\n"
    r = run1("quit(2)", iso, audit)
    assert r.status == "exit" and r.code == 2 and not r.completed


@pytest.mark.parametrize("iso,audit", _params())
def test_cannot_read_etc_passwd(iso, audit):
    r = run1("print(open('/etc/passwd').read().split(':')[0])", iso, audit)
    assert "root" not in r.stdout
    assert r.status != "ok"


@pytest.mark.parametrize("iso,audit", _params())
def test_cannot_read_project_files(iso, audit):
    r = run1(f"print(open({str(PROJECT_FILE)!r}).read()[:40])", iso, audit)
    assert "Environments" not in r.stdout and r.status != "ok"
    r = run1(f"import os\nprint(os.listdir({str(PROJECT_FILE.parent)!r}))", iso, audit)
    assert "base.py" not in r.stdout and r.status != "ok"


@pytest.mark.parametrize("iso,audit", _params())
def test_cannot_write_outside(iso, audit, tmp_path):
    tmp_path.chmod(0o777)
    targets = [Path("/tmp") / f"swarmrl_pwned_{os.getpid()}_{iso}_{audit}", tmp_path / "pwned",
               PROJECT_FILE.parent / f"pwned_{os.getpid()}"]
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    victim.chmod(0o666)
    prog = "ok = 0\n"
    for t in targets:
        prog += f"try:\n    open({str(t)!r}, 'w').write('x'); ok += 1\nexcept Exception:\n    pass\n"
    prog += f"import os\ntry:\n    os.remove({str(victim)!r}); ok += 1\nexcept Exception:\n    pass\nprint(ok)"
    prog += f"\ntry:\n    open({str(targets[0])!r}, 'w').write('x')\nexcept Exception:\n    pass\n"
    r = run1(prog.replace(f"open({str(targets[0])!r}, 'w').write('x'); ok += 1", "pass", 1), iso, audit)
    assert r.stdout.strip() == "0"  # /tmp inside the sandbox may be its own; the rest must all fail
    for t in targets:
        assert not t.exists()
    assert victim.read_text() == "keep"


@pytest.mark.parametrize("iso,audit", _params())
def test_no_network(iso, audit):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(0.1)
    port = srv.getsockname()[1]
    accepted = []
    stop = threading.Event()

    def accept():
        while not stop.is_set() and not accepted:
            try:
                accepted.append(srv.accept())
            except OSError:
                pass

    th = threading.Thread(target=accept)
    th.start()
    prog = (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "s.sendall(b'hi')\nprint('connected')")
    try:
        r = run1(prog, iso, audit)
    finally:
        stop.set()
        th.join()
    srv.settimeout(0.05)
    try:  # nothing left waiting in the backlog either
        accepted.append(srv.accept())
    except OSError:
        pass
    srv.close()
    assert not accepted
    assert "connected" not in r.stdout and r.status != "ok"


@pytest.mark.parametrize("iso,audit", _params())
def test_infinite_loop_times_out(iso, audit):
    r = run1("while True:\n    pass", iso, audit)
    assert r.status in ("timeout", "signal") and not r.completed


@pytest.mark.parametrize("iso,audit", _params())
def test_fork_bomb_contained(iso, audit):
    prog = ("import os\nwhile True:\n    try:\n        os.fork()\n    except BaseException:\n        pass\n")
    r = run1(prog, iso, audit)
    assert not r.completed
    time.sleep(0.2)
    assert sandbox_procs() == []


@pytest.mark.parametrize("iso,audit", _params())
def test_escaped_background_process_is_killed(iso, audit):
    prog = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n    os._exit(0)\n"
            "print('parent done')")
    run1(prog, iso, audit)
    time.sleep(0.2)
    assert sandbox_procs() == []


@pytest.mark.parametrize("iso,audit", _params())
def test_huge_output_capped(iso, audit):
    r = run1("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", iso, audit, out_bytes=1 << 16)
    assert not r.completed
    assert len(r.stdout) <= (1 << 16) + 1
    r = run1("print('y' * 10**8)", iso, audit, out_bytes=1 << 16)
    assert not r.completed


@pytest.mark.parametrize("iso,audit", _params())
def test_memory_bomb(iso, audit):
    r = run1("x = bytearray(16 * 1024**3)\nprint('allocated')", iso, audit)
    assert "allocated" not in r.stdout and not r.completed
    r = run1("xs = []\nwhile True:\n    xs.append(bytearray(64 * 1024**2))", iso, audit, mem_bytes=256 * 1024**2)
    assert not r.completed


@pytest.mark.parametrize("iso,audit", _params())
def test_cannot_kill_harness_or_host(iso, audit):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        prog = ("import os\nfor p in [1, os.getppid(), %d]:\n    try:\n        os.kill(p, 9)\n"
                "    except BaseException:\n        pass\nprint('survived')" % victim.pid)
        r = run1(prog, iso, audit)  # run1 asserts the harness still reported
        assert victim.poll() is None
        if iso == "namespaces":
            assert r.stdout.strip() == "survived"
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.parametrize("iso,audit", _params())
def test_subprocess_and_shell(iso, audit):
    r = run1("import subprocess\nprint(subprocess.run(['cat', '/etc/passwd'], capture_output=True, text=True).stdout[:4])",
             iso, audit)
    assert "root" not in r.stdout
    r = run1("import os\nos.system('cat /etc/passwd')", iso, audit)
    assert "root:" not in r.stdout


@pytest.mark.parametrize("iso,audit", _params())
def test_environment_scrubbed(iso, audit, monkeypatch):
    monkeypatch.setenv("SWARMRL_SECRET_TOKEN", "hunter2")
    r = run1("import os\nprint(dict(os.environ))", iso, audit)
    assert "hunter2" not in r.stdout


@pytest.mark.parametrize("iso,audit", _params())
def test_cases_do_not_share_files(iso, audit):
    prog = ("import os\nprint(os.path.exists('state.txt'))\nopen('state.txt', 'w').write('1')")
    run = run_program(prog, [{"input": ""}, {"input": ""}], "stdio",
                      SandboxLimits(audit_hook=audit, **FAST), iso)
    assert [r.stdout.strip() for r in run.results] == ["False", "False"]


def test_program_and_case_limits():
    run = run_program("x" * (SandboxLimits().max_program_bytes + 1), [{"input": ""}])
    assert run.error and run.results[0].status == "error"
    run = run_program("print(1)", [{"input": ""}] * (SandboxLimits().max_cases + 1))
    assert run.error


def test_function_mode_early_exit_is_not_a_pass():
    prog = "import os\ndef f(x):\n    return x\nos._exit(0)"
    run = run_program(prog, [{"test": "assert f(1) == 2"}], "function", SandboxLimits(**FAST))
    assert not run.results[0].completed


def _code_task(vi: dict) -> Task:
    return Task(task_id="code:t", env="code", prompt="p", verification_info=vi, task_type="verifiable_code")


def test_hostile_completion_gets_zero_reward():
    env = CodeEnv(wall_s=1.5, cpu_s=2)
    task = _code_task({"test_cases": [{"input": "", "output": "root\n"}]})
    assert env.verify(task, "```python\nprint('root')\n```") == 1.0  # the check can pass...
    hostile = "```python\nprint(open('/etc/passwd').read().split(':')[0])\n```"
    assert env.verify(task, hostile) == 0.0  # ...but not by reading the host
    assert env.verify(task, "```python\nwhile True: pass\n```") == 0.0
    assert env.verify(task, "```python\nimport os\nwhile True: os.fork()\n```") == 0.0
    assert sandbox_procs() == []


def test_large_input_and_concurrent_runs():
    from concurrent.futures import ThreadPoolExecutor

    big = "7\n" * 1_000_000  # 2 MB of stdin
    prog = "import sys\nprint(sum(map(int, sys.stdin.read().split())))"

    def one(i):
        run = run_program(prog, [{"input": big if i == 0 else f"{i} {i}\n"}], "stdio", SandboxLimits(wall_s=20, cpu_s=20))
        return run.results[0].stdout.strip()

    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(one, range(6)))
    assert outs == ["7000000"] + [str(2 * i) for i in range(1, 6)]


@pytest.mark.parametrize("iso,audit", _params())
def test_native_escape_hatches(iso, audit):
    prog = ("import ctypes, sys\nlibc = ctypes.CDLL(None)\nsys.stdout.flush()\n"
            "libc.system(b'cat /etc/passwd')\nprint('ran')")
    r = run1(prog, iso, audit)
    assert "root:" not in r.stdout
    if audit:
        assert "ran" not in r.stdout and "denied" in r.stderr
    r = run1("import _posixsubprocess\nprint('imported')", iso, audit)
    assert ("imported" not in r.stdout) == audit
