"""The supervisor: starts role processes (``python -m swarmrl ...``), watches them, restarts the ones that may
be restarted, and stops them all at the end. Used by ``swarmrl run`` in both modes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from swarmrl.job.derive import RoleSpec
from swarmrl.job.zygote import ZYGOTE_ROLES, Zygote, ZygoteChild
from swarmrl.protocol.client import wait_until_up
from swarmrl.utils.procs import child_env, stop_process
from swarmrl.wan.netns import NETNS_ENV


class RoleFailed(RuntimeError):
    """A role exited more often than its restarts allow (``max_restarts``), or the main role failed."""


def role_env(netns: str = "") -> dict[str, str]:
    """A role's environment: one OpenMP thread unless the caller's environment says otherwise (roles set their
    torch threads from their configs); a role that fails leaves its traceback in its log (``SWARMRL_DEBUG=1``:
    the command line's ``--debug``); under a network profile, the namespace it enters first (``swarmrl.wan``)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               SWARMRL_DEBUG="1")
    env.pop(NETNS_ENV, None)
    if netns:
        env[NETNS_ENV] = netns
    return env


def spawn(argv: list[str], log: Path, netns: str = "") -> subprocess.Popen:
    """``python -m swarmrl <argv>`` in its own session, output appended to ``log``; it dies with this process
    (``child_env``: its own session puts it out of reach of the signals that end this one)."""
    with open(log, "ab") as f:
        return subprocess.Popen([sys.executable, "-m", "swarmrl", *argv], stdout=f, stderr=subprocess.STDOUT,
                                env=child_env(role_env(netns)), start_new_session=True)


class Supervisor:
    def __init__(self, logs: Path, progress: Callable[[str], None] = print, url: str = "",
                 pids_file: Path | None = None, zygote: Zygote | None = None) -> None:
        self.logs = logs
        self.zygote = zygote  # forks the torch roles (ZYGOTE_ROLES) when given
        self.logs.mkdir(parents=True, exist_ok=True)
        self.progress = progress
        self.url = url  # the orchestrator a ``wait_up`` role must answer on
        self.pids_file = pids_file
        self.specs: dict[str, RoleSpec] = {}
        self.procs: dict[str, subprocess.Popen | ZygoteChild] = {}
        self.restarts: dict[str, int] = {}

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def forks(self, spec: RoleSpec) -> bool:
        """Whether ``spec`` is started by forking the zygote (once it has imported)."""
        return self.zygote is not None and tuple(spec.argv[:2]) in ZYGOTE_ROLES

    def _spawn(self, spec: RoleSpec) -> subprocess.Popen | ZygoteChild:
        if self.forks(spec):
            try:
                return self.zygote.spawn(spec.argv, self.log(spec.name), role_env(spec.netns))
            except RuntimeError as e:  # started plainly from now on: slower, never worse
                self.progress(f"{e}; starting roles as plain processes")
                self.zygote = None
        return spawn(spec.argv, self.log(spec.name), spec.netns)

    def start(self, spec: RoleSpec) -> subprocess.Popen | ZygoteChild:
        self.specs[spec.name] = spec
        p = self._spawn(spec)
        self.procs[spec.name] = p
        if spec.wait_up:
            wait_until_up(self.url, p)
        self._write_pids()
        return p

    def _write_pids(self) -> None:
        if self.pids_file is None:
            return
        tmp = self.pids_file.with_name(f".{self.pids_file.name}.tmp")
        tmp.write_text(json.dumps({k: p.pid for k, p in self.procs.items()}))
        os.replace(tmp, self.pids_file)

    def _may_restart(self, spec: RoleSpec, code: int) -> bool:
        if spec.restart == "never":
            return False
        if spec.restart == "unless_refused":
            return code != 3 and code >= 0  # ejected / refused, or killed from outside: its work is reassigned
        return True

    def check(self) -> None:
        """Restart every role that exited and may be restarted; ``RoleFailed`` once a role's group has used its ``max_restarts``."""
        for name, p in list(self.procs.items()):
            code = p.poll()
            spec = self.specs[name]
            if code is None or (spec.finishes and code == 0) or not self._may_restart(spec, code):
                continue
            group = spec.restart_group or name
            self.restarts[group] = self.restarts.get(group, 0) + 1
            if self.restarts[group] > spec.max_restarts:
                raise RoleFailed(f"{name} keeps failing; see {self.log(name)}")
            self.progress(f"{name} exited with {code}; restarting it")
            self.start(spec)

    def watch(self, main: str, is_done: Callable[[], bool], live: Callable[[], None] | None = None,
              interval_s: float = 1.0) -> int:
        """Until the ``main`` role has finished (exit 0) or failed for good: restart the roles that exited as
        their specs allow, ``main`` included (none once ``is_done``), call ``live`` every ``interval_s``;
        returns ``main``'s last exit code."""
        while True:
            code = self.procs[main].poll()
            if code is not None and (code == 0 or is_done() or not self._may_restart(self.specs[main], code)):
                return code
            if not is_done():
                self.check()
            if live is not None:
                live()
            try:  # the main role's end is seen at once, not up to interval_s later
                self.procs[main].wait(timeout=interval_s)
            except subprocess.TimeoutExpired:
                pass

    def stop_all(self) -> None:
        """Stop every role (those marked ``stop_last`` after the others)."""
        order = sorted(self.procs, key=lambda n: self.specs[n].stop_last)
        for name in order:
            spec = self.specs[name]
            stop_process(self.procs[name], wait_s=spec.stop_wait_s, term_s=spec.stop_term_s)
