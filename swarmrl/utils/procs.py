"""Process and port helpers shared by the launchers (RL, swarm, DiLoCo)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, MutableMapping

# A child started with ``child_env`` finds its parent's pid here and asks the kernel to kill it when that parent
# dies (``adopt_parent_death``): roles run in sessions of their own, so nothing else reaches them once the
# launcher is gone (SIGKILL, the OOM killer, a crash). swarmrl/__main__.py spells the name out (a cheap check).
PARENT_ENV = "SWARMRL_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when its parent ``parent`` dies (Linux ``PR_SET_PDEATHSIG``;
    elsewhere nothing). If ``parent`` is already gone (this process was reparented before the request, so the
    kernel will never signal it), the signal is sent now.

    SIGKILL by default: a role must stop even if it handles or ignores SIGTERM (uvicorn waits for open
    connections), and every role already survives a ``kill -9`` (checkpoints and files are committed atomically).
    The signal follows the death of the parent *thread* that forked this process: start children from a thread
    that outlives them."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes  # noqa: PLC0415  # lazy: only children that die with a parent load it

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a child that must die with this process: it names this process as the parent to watch."""
    return {**env, PARENT_ENV: str(os.getpid())}


def adopt_parent_death(environ: MutableMapping[str, str] = os.environ) -> None:
    """At a child's start: if its environment names a parent (``child_env``), die with it. The variable is
    removed, so this process's own children (which have another parent) do not inherit a wrong one."""
    value = environ.pop(PARENT_ENV, None)
    if value is not None and value.isdigit():
        die_with_parent(int(value))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def stop_process(p: subprocess.Popen, wait_s: float = 0.0, term_s: float = 5.0) -> None:
    """Give ``p`` ``wait_s`` to exit by itself, then SIGTERM its process group, then SIGKILL after ``term_s``.

    ``p`` must have been started with ``start_new_session=True`` (its pid is its group id).
    """
    if p.poll() is not None:
        return
    if wait_s > 0:
        try:
            p.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        p.wait(timeout=term_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
