"""A long-lived helper process spoken to in JSON lines, for verifiers whose work an untrusted completion can make
unbounded (math-verify on ``10^{10^{10}}``, a reasoning-gym scorer asked for ten to the billionth power).

The script (a file next to this one, run by path with ``python -I`` so it imports nothing from swarmrl) prints
``{"ready": true}`` once started, then answers one JSON line per request line. The parent bounds every request's
time: a reply that does not come in time kills the process (its whole session) and the next request starts a new
one, so a hostile answer costs a restart, never a hang. The script bounds itself too (``_worker_guard.py``), for
when no parent is left to: its memory, each request's CPU seconds (the request's time limit, sent with it as
``cpu_s``), and its life: the kernel kills it when its parent dies (``PR_SET_PDEATHSIG``), busy or not. That
signal fires when the *thread* that started the process ends, and verifiers run on worker threads that come and
go, so every helper is started from one thread that lives as long as this process (``_spawn``). Idle, it also
ends on its own: its request pipe closes with the parent.
"""

from __future__ import annotations

import json
import math
import os
import queue
import select
import subprocess
import sys
import threading
from concurrent.futures import Future
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
        proc = _spawn([sys.executable, "-I", "-u", str(self.script)],
                      {**env, **self.env, PARENT_ENV: str(os.getpid())})
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
        try:  # its CPU seconds: the wall time it is given (one thread), rounded up, and one more
            proc.stdin.write(json.dumps({**request, "cpu_s": math.ceil(timeout_s) + 1}) + "\n")
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


PARENT_ENV = "SWARMRL_LINEWORKER_PARENT"  # _worker_guard.PARENT_ENV: the helper dies with this pid
_requests: queue.SimpleQueue[tuple[list[str], dict[str, str], Future[subprocess.Popen[str]]]] = queue.SimpleQueue()
_spawner: threading.Thread | None = None
_spawner_lock = threading.Lock()


def _spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """``argv`` started by the spawner thread, which lives as long as this process (a daemon that never returns):
    the helper's parent-death signal then fires when the process dies, not when a verifier's thread ends."""
    global _spawner
    with _spawner_lock:
        if _spawner is None or not _spawner.is_alive():
            _spawner = threading.Thread(target=_spawn_forever, name="swarmrl-lineworker-spawner", daemon=True)
            _spawner.start()
    done: Future[subprocess.Popen[str]] = Future()
    _requests.put((argv, env, done))
    return done.result()


def _spawn_forever() -> None:
    while True:
        argv, env, done = _requests.get()
        try:
            done.set_result(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=subprocess.DEVNULL, text=True, env=env, start_new_session=True))
        except BaseException as e:  # noqa: BLE001 - handed to the caller, who raises it
            done.set_exception(e)


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
