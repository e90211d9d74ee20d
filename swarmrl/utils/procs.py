"""Process and port helpers shared by the launchers (RL, swarm, DiLoCo)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess


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
