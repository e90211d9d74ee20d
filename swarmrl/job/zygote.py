"""A zygote for ``swarmrl run``: one process imports torch, transformers and the role modules once, then forks
the role processes that need them (workers, nodes, validator; the trainer imports on its own, on the other core
meanwhile) on the launcher's request.

Started as its own process (``python -m swarmrl.job.zygote``, in its own session) before anything else, so its
imports overlap the launcher's set-up and the light roles' start (orchestrator, adapter, relays are spawned
plainly); a forked role starts with those modules already imported instead of each role importing them
again beside the others on the same cores (~4 CPU-s per process for torch + a transformers model class).

Each child is a real process of its own: ``os.setsid`` (its pid is its process group, as ``spawn`` makes it),
stdin from /dev/null, stdout and stderr appended to its log, the role's environment, fresh random state for
torch / numpy (Python's ``random`` reseeds itself at fork), then ``python -m swarmrl <argv>``'s code path
(``runpy``). The zygote stays single-threaded (it forks), reaps its children and reports their exit codes.

Protocol (JSON lines, private to the launcher): requests on the zygote's stdin
``{"id": n, "argv": [...], "log": path, "env": {...}}``; replies on its stdout ``{"ready": true, "s": t}`` once
imported, ``{"id": n, "pid": p}`` (or ``{"id": n, "error": msg}``) per request, ``{"exit": p, "code": c}`` per
child that ended (``c`` as ``Popen.returncode``: negative for a signal). EOF on stdin ends the zygote.

Lifetimes: the zygote dies with the launcher and every forked role with the zygote (``PR_SET_PDEATHSIG``,
``swarmrl.utils.procs``), so a launcher that dies (SIGKILL, a crash) leaves no role behind although each is in a
session of its own. The launcher stops its roles before it closes the zygote; a role whose zygote crashed ends
with it and is restarted plainly as its spec allows.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import setproctitle

from swarmrl.utils.procs import PARENT_ENV, adopt_parent_death, child_env, die_with_parent

__all__ = ["ZYGOTE_ROLES", "Zygote", "ZygoteChild", "fresh_random_state", "preload_modules"]

# roles forked from the zygote: the ones that import torch and a model (the others start in a fraction of it)
ZYGOTE_ROLES = (("rl", "worker"), ("node", "run"), ("validator", "run"))

# "typer": most of what the children's ``python -m swarmrl`` costs to import before its command runs (the CLI's
# own modules are light by design); the CLI itself is not named here: nothing below it imports it, not even by
# name (tests/test_architecture.py)
_BASE = ("torch", "transformers", "typer", "swarmrl.rl.config", "swarmrl.generation.batch", "swarmrl.rl.worker",
         "swarmrl.swarm.config", "swarmrl.swarm.node", "swarmrl.attacks.config", "swarmrl.attacks.adversaries",
         "swarmrl.protocol.node", "swarmrl.protocol.client", "swarmrl.protocol.config", "swarmrl.protocol.validator")


def preload_modules(model_dir: str | Path | None) -> list[str]:
    """What the zygote imports: torch, transformers, the role modules, and the transformers module of the model's
    architecture (``config.json``'s ``model_type``; importing it is most of a role's import time)."""
    mods = list(_BASE)
    try:
        mt = json.loads((Path(model_dir) / "config.json").read_text())["model_type"] if model_dir else None
    except (OSError, ValueError, KeyError, TypeError):
        mt = None
    if isinstance(mt, str) and mt.replace("_", "").isalnum():
        mods.append(f"transformers.models.{mt}.modeling_{mt}")
    return mods


def _send(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def fresh_random_state() -> None:
    """In a forked child: torch's and numpy's global generators seeded anew (they would repeat the zygote's, so
    every role would draw the same numbers; Python's ``random`` reseeds itself at fork)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(None)


def _child(argv: list[str], log: str, env: dict[str, str], fds: tuple[int, ...], zygote: int) -> None:
    """In the forked child: become the role process, never return."""
    code = 1
    try:
        die_with_parent(zygote)  # first: the zygote may die at any moment (zygote: its pid, taken before the fork)
        env.pop(PARENT_ENV, None)  # the launcher's, not this process's parent
        os.setsid()
        # ps / top show the role (before the environment is replaced: setproctitle finds argv's memory by it)
        setproctitle.setproctitle(" ".join([sys.executable, "-m", "swarmrl", *argv]))
        for fd in fds:  # the zygote's pipes (0 and 1 among them are replaced below)
            if fd > 2:
                os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for src, dst in ((devnull, 0), (out, 1), (out, 2)):
            if src != dst:
                os.dup2(src, dst)
        for fd in {devnull, out} - {0, 1, 2}:
            os.close(fd)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        os.environ.clear()
        os.environ.update(env)
        fresh_random_state()
        sys.argv = [sys.executable, *argv]
        import runpy  # noqa: PLC0415

        try:
            runpy.run_module("swarmrl", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, int) and e.code is not None:
                print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001  # the role's traceback goes to its log, as a spawned role's does
        import traceback  # noqa: PLC0415

        traceback.print_exc()
        code = 1
    finally:
        try:
            _shut_down()
        finally:
            os._exit(code)


def _shut_down() -> None:
    """What the interpreter does before a spawned role's process ends, which ``os._exit`` would skip: wait for
    the role's non-daemon threads, run its ``atexit`` functions, flush its streams."""
    try:
        me = threading.current_thread()
        for t in threading.enumerate():
            if t is not me and not t.daemon:
                t.join()
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001
        import traceback  # noqa: PLC0415

        traceback.print_exc()
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except (OSError, ValueError):
                pass


def serve(modules: list[str]) -> None:
    """The zygote's loop (``python -m swarmrl.job.zygote MODULE...``)."""
    t0 = time.monotonic()
    for m in modules:
        try:
            importlib.import_module(m)
        except Exception as e:  # noqa: BLE001  # a role imports what it needs itself: a missing extra is its error
            print(f"zygote: not preloaded {m}: {type(e).__name__}: {e}", file=sys.stderr)
    _send({"ready": True, "s": round(time.monotonic() - t0, 3)})
    buf = b""
    children: set[int] = set()
    fin = sys.stdin.buffer.fileno()
    while True:
        ready, _, _ = select.select([fin], [], [], 0.05)
        if ready:
            data = os.read(fin, 1 << 16)
            if not data:
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    req = json.loads(line)
                    argv, log, env, rid = list(req["argv"]), str(req["log"]), dict(req["env"]), req["id"]
                except (ValueError, KeyError, TypeError) as e:
                    _send({"error": f"bad request: {e}"})
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                me = os.getpid()
                try:
                    pid = os.fork()
                except OSError as e:  # out of processes or memory: the launcher starts the role plainly
                    _send({"id": rid, "error": f"fork failed: {e}"})
                    continue
                if pid == 0:
                    _child(argv, log, env, (fin, sys.stdout.fileno()), me)
                children.add(pid)
                _send({"id": rid, "pid": pid})
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            if pid == 0:
                break
            children.discard(pid)
            _send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


class ZygoteChild:
    """A role forked by the zygote, with the part of ``subprocess.Popen``'s interface the supervisor uses."""

    def __init__(self, zygote: Zygote, pid: int, args: list[str]) -> None:
        self.zygote = zygote
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def poll(self) -> int | None:
        if self.returncode is None and not self.zygote.alive():
            self._orphaned()
        return self.returncode

    def _orphaned(self) -> None:
        """The zygote is gone, so nobody reports this child's exit: it counts as ended once its pid is."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            self._exited(-1)
        except PermissionError:
            pass

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._ended.wait(0.05 if left is None else min(0.05, left))
        assert self.returncode is not None
        return self.returncode


class Zygote:
    """The launcher's side: starts the zygote process at once (its imports run while the launcher goes on),
    ``spawn`` forks a role from it once it is ready."""

    def __init__(self, modules: list[str], log: Path, ready_timeout_s: float = 300.0) -> None:
        self.log = log
        self.ready_timeout_s = ready_timeout_s
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        with open(log, "ab") as f:
            self.proc = subprocess.Popen([sys.executable, "-m", "swarmrl.job.zygote", *modules],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=f,
                                         env=child_env(env), start_new_session=True)
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._replies: dict[int, dict] = {}
        self._reply = threading.Condition(self._lock)
        self._children: dict[int, ZygoteChild] = {}
        self._early_exits: dict[int, int] = {}
        self._next = 0
        self._closed = False
        self.ready_s: float | None = None
        self._reader = threading.Thread(target=self._read, name="zygote-reader", daemon=True)
        self._reader.start()

    def alive(self) -> bool:
        return self.proc.poll() is None and not self._closed

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                if msg.get("ready"):
                    self.ready_s = msg.get("s")
                    self._ready.set()
                elif "exit" in msg:
                    child = self._children.get(msg["exit"])
                    if child is not None:
                        child._exited(int(msg["code"]))
                    else:  # ended before its spawn reply was handled
                        self._early_exits[int(msg["exit"])] = int(msg["code"])
                elif "id" in msg:
                    self._replies[int(msg["id"])] = msg
                    self._reply.notify_all()
        with self._lock:
            self._closed = True
            self._ready.set()
            self._reply.notify_all()

    def spawn(self, argv: list[str], log: Path, env: dict[str, str]) -> ZygoteChild:
        """Fork ``python -m swarmrl <argv>`` from the zygote; ``RuntimeError`` if the zygote is not there."""
        if not self._ready.wait(self.ready_timeout_s) or not self.alive():
            raise RuntimeError(f"the zygote is not running; see {self.log}")
        with self._lock:
            rid = self._next
            self._next += 1
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps({"id": rid, "argv": argv, "log": str(log), "env": env}) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as e:
            raise RuntimeError(f"the zygote is not running ({e}); see {self.log}") from None
        with self._lock:
            while rid not in self._replies:
                if self._closed:
                    raise RuntimeError(f"the zygote ended; see {self.log}")
                self._reply.wait(1.0)
            msg = self._replies.pop(rid)
            if "pid" not in msg:
                raise RuntimeError(f"the zygote could not start {argv[:2]}: {msg.get('error')}")
            child = ZygoteChild(self, int(msg["pid"]), ["swarmrl", *argv])
            self._children[child.pid] = child
            if child.pid in self._early_exits:
                child._exited(self._early_exits.pop(child.pid))
        return child

    def close(self) -> None:
        """End the zygote (the supervisor stops its children first; any still running die with it)."""
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    adopt_parent_death()  # the zygote dies with the launcher, and its children with it
    serve(sys.argv[1:])
