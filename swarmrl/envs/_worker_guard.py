"""Limits a verifier's helper process (``envs.lineworker``) puts on itself; stdlib only, loaded by path by the
helper scripts (``_mathcheck_worker.py``, ``_rgscore_worker.py``), which import nothing from swarmrl.

* ``die_with_parent``: the kernel kills this process when the process that started it dies
  (``PR_SET_PDEATHSIG``), even in the middle of a computation that never returns to Python (a big-integer power
  holds the interpreter in C). ``LineWorker`` starts its helpers from one thread that lives as long as its process,
  since the signal follows the death of the starting *thread*.
* ``limit_memory``: an address-space cap (``RLIMIT_AS``).
* ``limit_cpu``: before each request, the CPU seconds that request may use (``RLIMIT_CPU``, soft limit moved to
  the seconds used so far plus the request's budget): past it the kernel ends the process (``SIGXCPU``), so a
  hostile item is bounded with no parent left to time it out.
"""

from __future__ import annotations

import ctypes
import math
import os
import resource
import signal
import sys

PARENT_ENV = "SWARMRL_LINEWORKER_PARENT"  # the pid of the process that started this helper
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL this process when its parent (``PARENT_ENV``) dies; exit now if it already has. Also no core files:
    a helper ended by its limits leaves nothing behind."""
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ValueError, OSError):
        pass
    parent = os.environ.get(PARENT_ENV, "")
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != int(parent):  # the parent died before the request: the kernel will never signal
        os._exit(1)


def limit_memory(cap_bytes: int) -> None:
    try:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = cap_bytes if hard == resource.RLIM_INFINITY else min(cap_bytes, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ValueError, OSError):
        pass


def limit_cpu(seconds: object) -> None:
    """Allow this process ``seconds`` more CPU seconds (rounded up; a missing or bad value changes nothing)."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not 0 < seconds < 1e6:
        return
    use = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(use.ru_utime + use.ru_stime + seconds)
    try:
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    except (ValueError, OSError):
        pass
