"""The verifiers' helper processes (``envs.lineworker``): they answer, and they never outlive their parent."""

from __future__ import annotations

import os
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
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid), "the helper process outlived its parent"
    finally:
        parent.kill()
