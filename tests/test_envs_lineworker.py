"""The verifiers' helper processes (``envs.lineworker``): they answer, and they never outlive their parent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from swarmrl.envs.lineworker import LineWorker


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by init) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def _kill_parent_and_wait_gone(parent: subprocess.Popen, pid: int, timeout_s: float) -> bool:
    """Kill the parent outright (no atexit, no close); True once its helper ``pid`` is gone, False at the bound."""
    parent.kill()
    parent.wait(10)
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(pid)


def test_worker_answers_and_restarts_after_close():
    w = LineWorker("_mathcheck_worker.py", "math answer checker", start_timeout_s=60.0)
    try:
        with w.lock:
            assert w.ensure() and not w.ensure()  # started once, then running
            assert w.call({"gold": "\\frac{1}{2}", "pred": "0.5"}, 30.0) == {"ok": True}
            assert w.call({"gold": "1", "pred": "2"}, 30.0) == {"ok": False}
        w.close()
        with w.lock:
            assert w.ensure()  # a closed worker starts again on demand
    finally:
        w.close()


def test_worker_dies_with_its_parent():
    """The parent is killed outright (no atexit, no close): the worker's request pipe closes and it exits."""
    code = textwrap.dedent("""
        import os, sys, time
        from swarmrl.envs.lineworker import LineWorker
        w = LineWorker("_mathcheck_worker.py", "checker", start_timeout_s=60.0)
        with w.lock:
            w.ensure()
        print(w._proc.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        assert _alive(pid)
        assert _kill_parent_and_wait_gone(parent, pid, 30), "the helper process outlived its parent"
    finally:
        parent.kill()


HOSTILE = {"gold": "1", "pred": "10^{10^{10}}"}  # keeps the checker computing for minutes, in C


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        utime, stime = f.read().split(") ")[1].split()[11:13]
    return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")


def test_a_busy_worker_dies_with_its_parent():
    """The parent is killed while the helper computes a hostile item (no read of its pipe until that ends): the
    kernel's parent-death signal stops it, not minutes later."""
    code = textwrap.dedent(f"""
        import sys, threading
        from swarmrl.envs.lineworker import LineWorker
        w = LineWorker("_mathcheck_worker.py", "checker", start_timeout_s=60.0)
        def start():  # from a thread that ends at once, as a verifier's worker thread may
            with w.lock:
                w.ensure()
        t = threading.Thread(target=start)
        t.start()
        t.join()
        print(w._proc.pid, flush=True)
        with w.lock:
            w.call({HOSTILE!r}, 600.0)
    """)
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = None
    try:
        pid = int(parent.stdout.readline())
        deadline = time.monotonic() + 60
        while _alive(pid) and _cpu_s(pid) < 1.0 and time.monotonic() < deadline:
            time.sleep(0.1)  # busy on the item (the starting thread has ended, the helper lives on)
        assert _alive(pid) and _cpu_s(pid) >= 1.0
        assert _kill_parent_and_wait_gone(parent, pid, 20), "the busy helper outlived its parent"
    finally:
        parent.kill()
        if pid is not None and _alive(pid):  # (on failure: not left computing for minutes)
            os.kill(pid, signal.SIGKILL)


def test_a_worker_started_from_a_thread_that_ended_keeps_serving():
    import threading

    w = LineWorker("_mathcheck_worker.py", "math answer checker", start_timeout_s=60.0)
    try:
        def start() -> None:
            with w.lock:
                w.ensure()

        t = threading.Thread(target=start)
        t.start()
        t.join()
        time.sleep(0.5)
        with w.lock:
            assert not w.ensure()  # still running: the thread that asked for it has ended, its parent has not
            assert w.call({"gold": "2", "pred": "2"}, 30.0) == {"ok": True}
    finally:
        w.close()


def test_a_worker_bounds_each_requests_cpu_seconds_itself():
    """With no parent left to time it out, a request's CPU seconds (``cpu_s``, sent with it) still end it."""
    from swarmrl.envs import lineworker

    script = os.path.join(os.path.dirname(lineworker.__file__), "_mathcheck_worker.py")
    proc = subprocess.Popen([sys.executable, "-I", "-u", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env={"PATH": os.environ.get("PATH", "")})
    try:
        assert "ready" in proc.stdout.readline()
        proc.stdin.write(json.dumps({**HOSTILE, "cpu_s": 2}) + "\n")
        proc.stdin.flush()
        assert proc.wait(120) == -signal.SIGXCPU  # (minutes of CPU without the limit)
    finally:
        proc.kill()
        proc.wait()
