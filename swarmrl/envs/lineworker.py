"""A long-lived helper process spoken to in JSON lines, for verifiers whose work an untrusted completion can make
unbounded (math-verify on ``10^{10^{10}}``, a reasoning-gym scorer asked for ten to the billionth power).

The script (a file next to this one, run by path with ``python -I`` so it imports nothing from swarmrl) prints
``{"ready": true}`` once started, then answers one JSON line per request line. The parent bounds every request's
time: a reply that does not come in time kills the process (its whole session) and the next request starts a new
one, so a hostile answer costs a restart, never a hang; the script caps its own memory. The process reads its
requests from a pipe: when the parent dies the pipe closes and the script's read loop ends, so it never outlives
its parent (a parent-death signal would not do: it fires when the starting *thread* ends, and verifiers run on
worker threads).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["LineWorker"]


class LineWorker:
    """One helper process running ``script``; ``lock`` serialises its users (a request and its reply are one
    exchange; hold it across several when they belong together)."""

    def __init__(self, script: str, what: str, start_timeout_s: float, env: dict[str, str] | None = None) -> None:
        self.script = Path(__file__).resolve().parent / script
        self.what, self.start_timeout_s = what, start_timeout_s
        self.env = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(env or {})}
        self.lock = threading.Lock()
        self.restarts = 0  # processes killed for overrunning (or for a broken reply)
        self._proc: subprocess.Popen[str] | None = None

    def ensure(self) -> bool:
        """Start the process if none is running; True when this call started it. Raises RuntimeError when it
        does not start (that says nothing about any completion). Call with ``lock`` held."""
        if self._proc is not None and self._proc.poll() is None:
            return False
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL")}
        proc = subprocess.Popen([sys.executable, "-I", "-u", str(self.script)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                env={**env, **self.env}, start_new_session=True)
        line = _readline(proc, self.start_timeout_s)
        if line is None or "ready" not in line:
            _kill(proc)
            raise RuntimeError(f"the {self.what} did not start")
        self._proc = proc
        return True

    def call(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """The reply to ``request``; None when none came in ``timeout_s`` or it was not a JSON object (the
        process is then killed and counted in ``restarts``). Call with ``lock`` held, after ``ensure``."""
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise RuntimeError(f"the {self.what} is not running")
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            line = _readline(proc, timeout_s)
            out = json.loads(line) if line is not None else None
        except (OSError, ValueError):
            out = None
        if not isinstance(out, dict):
            self._stop()
            self.restarts += 1
            return None
        return out

    def close(self) -> None:
        with self.lock:
            self._stop()

    def _stop(self) -> None:
        if self._proc is not None:
            _kill(self._proc)
            self._proc = None


def _readline(proc: subprocess.Popen[str], timeout_s: float) -> str | None:
    assert proc.stdout is not None
    r, _, _ = select.select([proc.stdout], [], [], timeout_s)
    return (proc.stdout.readline() or None) if r else None


def _kill(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
