"""Run untrusted Python programs against test cases, isolated from the host.

Process layout: host --(Popen, new session, scrubbed env)--> launcher (``_sandbox_launcher.py``,
``python -I -S -B``) --> harness (``_sandbox_harness.py``, pid 1 of its own pid namespace) --fork
per test case--> the untrusted program (``exec`` of its source in the forked child, stdin/stdout/
stderr redirected to files in the work dir). The launcher dies with the host (``PDEATHSIG=SIGKILL``), and the
harness with the launcher, so a host that dies mid-run leaves nothing running.

What is enforced, and by whom
=============================

Isolation ``"namespaces"`` (the default; it needs root or unprivileged user namespaces). The sandbox FAILS CLOSED:
where namespaces are not available no program runs (an internal error naming the cause) unless the caller chose
weaker isolation explicitly (``"auto"``: namespaces when available, else the fallback; ``"fallback"``).
``sandbox_status()`` / ``isolation_level()`` report what this machine gives (``python -m
swarmrl.envs.sandbox_check --expect namespaces`` prints it and fails below that: CI runs it). Enforced by the
KERNEL:

* network: a new network namespace (only a down loopback): no connection leaves the sandbox;
* filesystem: a new mount namespace whose root is a fresh size-capped tmpfs (``fs_bytes``, 4096
  inodes, nosuid/nodev/noexec) holding read-only binds of ``/usr``, ``/lib*``, ``/bin``, ``/sbin``
  and the interpreter's own prefix, plus ``/dev/{null,zero,urandom,random}``; the old root is
  detached after ``pivot_root``. ``/etc``, ``/home``, ``/root``, ``/proc``, ``/sys``, the project and
  the host ``/tmp`` do not exist inside. Writable: ``/work`` (cwd, mode 0700) and ``/tmp`` in the
  tmpfs, discarded afterwards;
* processes: a new pid namespace. The harness is pid 1 with ``PDEATHSIG=SIGKILL`` tied to the
  launcher, so killing the launcher's process group (the host's wall-time limit) or the harness
  finishing kills every descendant, including ones that ``setsid()``-ed away. Also new IPC and UTS
  namespaces;
* identity: as root, the program runs as a fresh random unprivileged uid/gid (no supplementary
  groups), so it cannot regain privileges (``no_new_privs``), cannot ``ptrace`` the harness
  (which is non-dumpable), and ``RLIMIT_NPROC`` counts only its own processes. Without root, a
  user namespace maps the caller to uid 0 inside and every capability is dropped before exec
  (the read-only binds cannot be remounted);
* resources (``setrlimit``): ``RLIMIT_AS`` (memory), ``RLIMIT_CPU`` (per case), ``RLIMIT_FSIZE``
  (per file; caps stdout/stderr files, so a huge output is killed by SIGXFSZ), ``RLIMIT_NPROC``
  (fork bombs), ``RLIMIT_NOFILE``, ``RLIMIT_CORE=0``; wall time per case (harness, SIGKILL to the
  case's process group) and overall (host, SIGKILL to the launcher's process group).

Enforced by a SECCOMP filter (``seccomp=True``, the default; every mode) installed in each case's process
after the harness set it up and before the program runs: a classic-BPF filter built with ctypes (no
library: the harness runs with ``-I -S`` and sees no site-packages) that KILLS the process at ``socket``
(except ``AF_UNIX``, which fails with EACCES: glibc tries nscd on any user lookup), ``ptrace``, ``process_vm_readv/writev``, the mount family (``mount``, ``umount2``, ``pivot_root``,
``chroot``, ``open_tree``, ``move_mount``, ``fs*``, ``mount_setattr``), ``kexec_load/kexec_file_load``,
``bpf``, ``keyctl``/``add_key``/``request_key``, ``perf_event_open``, ``unshare``, ``setns``, ``clone`` with
any ``CLONE_NEW*`` flag, module loading, ``reboot``, ``swapon/off``, ``userfaultfd``, handle-based opens,
``io_uring_*``, ``acct``, ``quotactl``, ``lookup_dcookie``, and any other ABI (i386 ``int 0x80``, x32);
``clone3`` gets ENOSYS (its flags are behind a pointer; libc falls back to ``clone``). A case killed there
reports ``status="signal"``, ``code=SIGSYS``, ``denied_syscall=True`` and says so in its stderr;
``SandboxRun.seccomp`` tells whether the filter was in place. If it cannot be installed (a kernel without seccomp, an
unsupported architecture), no program runs (an internal error) unless ``require_seccomp=False`` accepts the other
layers alone (then a warning).

Enforced by a Python AUDIT HOOK (``sys.addaudithook``) installed in each case's process before the
program runs (``audit_hook=True``, the default; a second layer under namespaces): ``open`` only
under the interpreter's stdlib, the work dir, ``/tmp`` and ``/dev`` (writes only under the work dir
and ``/tmp``), listing/removing/renaming files likewise; ``socket``, ``subprocess``, ``os.system``,
``os.exec*``, ``os.spawn*``, ``os.posix_spawn``, ``os.fork``, ``os.kill``, ``ctypes``, ``mmap``,
``setrlimit`` all raise ``PermissionError``, and so does importing ``_posixsubprocess``, ``ctypes``,
``socket``, ``subprocess``, ``multiprocessing``, ``pty``, ``mmap``, ``resource``, ``fcntl`` (modules
that reach processes, sockets or native code; the harness's own copies are dropped from
``sys.modules`` first so a re-import is seen). An audit hook is NOT a security boundary on its own (a
determined program can reach native code through channels that raise no audit event).

Isolation ``"fallback"`` (chosen explicitly, or by ``"auto"`` without namespaces): only the rlimits, the audit hook, a scrubbed
environment, ``python -I -S``, a fresh host temp dir as cwd, process-group kills and, when the
caller is root, the fresh unprivileged uid (file permissions then protect root-only files, and
every process of that uid is killed afterwards). World-readable host files (``/etc/passwd``, a
world-readable project tree) are then protected by the audit hook only, network by the audit hook
only, and disk use only per file (RLIMIT_FSIZE). The seccomp filter is installed here too.

Verdicts: the host alone holds expected outputs; a case's stdout is compared by the caller. The
harness never runs untrusted code. In ``"function"`` mode (assert-style tests) the tests run in the
program's own process, so a program can defeat them from inside (e.g. an object whose ``__eq__``
always returns True); prefer stdin/stdout or ``"call"`` tests (the return value is JSON-encoded in
the sandbox and compared by the host) for untrusted policies.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Mode = Literal["stdio", "function", "call"]
Isolation = Literal["auto", "namespaces", "fallback"]

_HERE = Path(__file__).resolve().parent
_LAUNCHER = _HERE / "_sandbox_launcher.py"
_HARNESS = _HERE / "_sandbox_harness.py"
_UID_BASE, _UID_SPAN = 2_000_000_000, 100_000_000
NO_SECCOMP_EXIT = 124  # the harness's exit status when the filter is required and does not install


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 5.0  # per test case
    cpu_s: int = 5  # per test case
    mem_bytes: int = 512 * 1024**2  # address space per process
    out_bytes: int = 1024**2  # stdout cap per case (larger output: the case fails)
    fs_bytes: int = 32 * 1024**2  # the sandbox's tmpfs (namespaces mode)
    nproc: int = 16  # processes of the sandbox uid (root) / of the user (fallback, non-root: unset)
    nofile: int = 64
    max_program_bytes: int = 64 * 1024
    max_cases: int = 64
    max_input_bytes: int = 4 * 1024**2  # all case inputs together
    audit_hook: bool = True  # forced on in the fallback, where it is the main barrier
    seccomp: bool = True  # a seccomp filter in each case's process (see DENIED_SYSCALLS in the harness)
    require_seccomp: bool = True  # no filter, no run (fail closed); False: run with the other layers alone


@dataclass
class CaseResult:
    status: str  # ok | exit | signal | timeout | error
    code: int | None = None
    completed: bool = False  # ran to the end (for function/call mode: the tests passed)
    stdout: str = ""
    stdout_truncated: bool = False
    stderr: str = ""
    ret: str | None = None  # call mode: JSON of the return value
    denied_syscall: bool = False  # killed by the seccomp filter (status "signal", code SIGSYS)


@dataclass
class SandboxRun:
    isolation: str
    results: list[CaseResult] = field(default_factory=list)
    error: str | None = None  # set when the sandbox itself failed (then results are all "error")
    internal: bool = False  # the error is the sandbox's own failure (did not start, broken report), not the program's
    seccomp: bool = False  # the seccomp filter was installed in every case's process


def _python() -> str:
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _ro_paths(python: str) -> list[str]:
    paths = ["/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin"]
    for extra in (os.path.realpath(sys.base_prefix), os.path.dirname(python)):
        if not any(extra == p or extra.startswith(p + "/") for p in paths):
            paths.append(extra)
    return paths


_level_lock = threading.Lock()
_status: dict[str, Any] | None = None
LEVELS = ("fallback", "namespaces")  # weakest first


def _probe(isolation: str) -> tuple[bool, SandboxRun]:
    """(whether it ran, the run) of a benign program in ``isolation``, the seccomp filter wanted but not required
    (so its absence is seen, not fatal)."""
    with warnings.catch_warnings():  # a probe's warnings are not the caller's: it may never use that mode
        warnings.simplefilter("ignore")
        run = _run("print(6*7)", [{"input": ""}], "stdio", SandboxLimits(wall_s=10, cpu_s=10, require_seccomp=False),
                   isolation=isolation)
    return run.error is None and bool(run.results) and run.results[0].stdout.strip() == "42", run


def sandbox_status() -> dict[str, Any]:
    """What this machine gives the sandbox, probed once per process: ``isolation`` (``"namespaces"`` when the
    kernel isolation works here, else ``"fallback"``), ``seccomp`` (whether the filter installs), ``error`` (why
    namespaces did not work, or None)."""
    global _status
    with _level_lock:
        if _status is None:
            ok, run = _probe("namespaces")
            if ok:
                _status = {"isolation": "namespaces", "seccomp": run.seccomp, "error": None}
            else:
                fb_ok, fb = _probe("fallback")
                _status = {"isolation": "fallback", "seccomp": fb_ok and fb.seccomp,
                           "error": run.error or "the probe program did not run"}
        return dict(_status)


def isolation_level() -> str:
    """``"namespaces"`` when the kernel isolation works here, else ``"fallback"`` (probed once)."""
    return sandbox_status()["isolation"]


def no_namespaces_message(status: dict[str, Any]) -> str:
    return ("code sandbox: kernel namespace isolation is not available here (it needs root or unprivileged user "
            f"namespaces: {status.get('error') or 'the probe failed'}); refusing to run untrusted code with weaker "
            "isolation. To accept the fallback (rlimits, seccomp and an audit hook, no kernel boundary around files "
            'and network), choose it explicitly: isolation = "auto" or "fallback"')


NO_SECCOMP_MESSAGE = ("code sandbox: the seccomp filter cannot be installed here (a kernel without seccomp, or an "
                      "unsupported architecture); refusing to run untrusted code without it. To accept the other "
                      "layers alone, set require_seccomp = false")


def expectation_problems(status: dict[str, Any], expect: str) -> list[str]:
    """Why ``status`` (``sandbox_status()``) is less than ``expect`` (a level of ``LEVELS``, with the seccomp
    filter); [] when it is not."""
    problems = []
    if LEVELS.index(status["isolation"]) < LEVELS.index(expect):
        problems.append(f"isolation {status['isolation']}, expected {expect}: {status.get('error')}")
    if not status["seccomp"]:
        problems.append("the seccomp filter does not install here")
    return problems


def run_program(program: str, cases: list[dict[str, Any]], mode: Mode = "stdio",
                limits: SandboxLimits | None = None, isolation: Isolation = "namespaces",
                prelude: str = "") -> SandboxRun:
    """Run ``program`` once per case, isolated; never raises for anything the program does.

    ``cases``: stdio mode ``{"input": str}``; function mode ``{"test": str}`` (run after the program
    and ``prelude`` in the same process; passing = no exception); call mode ``{"fn_name": str,
    "args": list}`` (the JSON of ``fn(*args)`` comes back in ``ret``).

    ``isolation``: ``"namespaces"`` (the default) runs nothing where namespaces are not available (an internal
    error); ``"auto"`` falls back to the weaker ``"fallback"`` there (a warning); ``"fallback"`` always uses it.
    """
    limits = limits or SandboxLimits()
    if isolation in ("namespaces", "auto"):
        status = sandbox_status()
        if status["isolation"] != "namespaces":
            if isolation == "namespaces":
                return _error_run("namespaces", len(cases), no_namespaces_message(status), internal=True)
            _warn_once("code sandbox: kernel namespaces unavailable, using the weaker fallback (isolation = "
                       f"\"auto\"; rlimits, seccomp and an audit hook): {status.get('error')}")
            isolation = "fallback"
    return _run(program, cases, mode, limits, isolation, prelude)


def _error_run(isolation: str, n: int, msg: str, internal: bool = False) -> SandboxRun:
    return SandboxRun(isolation=isolation, results=[CaseResult(status="error") for _ in range(n)], error=msg,
                      internal=internal)


def _run(program: str, cases: list[dict[str, Any]], mode: str, limits: SandboxLimits, isolation: str,
         prelude: str = "") -> SandboxRun:
    n = len(cases)
    if not isinstance(program, str) or len(program.encode("utf-8", errors="replace")) > limits.max_program_bytes:
        return _error_run(isolation, n, "program too large or not text")
    if n > limits.max_cases:
        return _error_run(isolation, n, f"too many cases ({n} > {limits.max_cases})")
    if sum(len(str(c.get("input", ""))) + len(str(c.get("test", ""))) + len(json.dumps(c.get("args", [])))
           for c in cases) + len(prelude) > limits.max_input_bytes:
        return _error_run(isolation, n, "test inputs too large")
    if n == 0:
        return SandboxRun(isolation=isolation)
    python = _python()
    isolate = isolation == "namespaces"
    # outside namespaces the private uid must be able to reach the interpreter on the host fs
    drop = os.geteuid() == 0 and (isolate or _others_can_run(python))
    uid = _UID_BASE + secrets.randbelow(_UID_SPAN) if drop else None
    if not isolate and os.geteuid() == 0 and uid is None:
        _warn_once("code sandbox: fallback isolation as root with an interpreter other users cannot run "
                   f"({python}): untrusted code runs as root behind the audit hook only")
    base = tempfile.mkdtemp(prefix="swarmrl-sbx-")
    try:
        os.chmod(base, 0o711)
        root = os.path.join(base, "root")
        work = os.path.join(base, "work")
        os.mkdir(root, 0o755)
        os.mkdir(work, 0o700)
        if uid is not None:
            os.chown(work, uid, uid)
        # the stdlib paths, as seen by the interpreter that runs inside
        stdlib = os.path.realpath(os.path.dirname(os.__file__))
        devs = ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"]
        read_roots = [os.path.realpath(sys.base_prefix), "/usr/lib/python3", stdlib] + devs
        work_in = "/work" if isolate else work
        tmp_in = "/tmp" if isolate else work
        args = {"isolate": isolate, "host_pid": os.getpid(), "python": python, "harness": str(_HARNESS), "root": root, "workdir": work,
                "uid": uid, "ro_paths": _ro_paths(python), "mem_bytes": int(limits.mem_bytes),
                "cpu_s": int(limits.cpu_s) * n + 5, "fsize_bytes": int(max(limits.out_bytes, limits.max_input_bytes, 1 << 16)) + 1,
                "nofile": int(limits.nofile), "fs_bytes": int(limits.fs_bytes),
                "nproc": int(limits.nproc) if (uid is not None or isolate) else None}
        spec = {"program": program, "mode": mode, "prelude": prelude, "cases": cases, "wall_s": limits.wall_s,
                "cpu_s": limits.cpu_s, "out_bytes": int(limits.out_bytes) + 1,
                "audit": limits.audit_hook or not isolate,  # the fallback always needs the hook
                "seccomp": limits.seccomp, "require_seccomp": limits.require_seccomp,
                "read_roots": read_roots + [work_in, tmp_in], "write_roots": [work_in, tmp_in],
                "sweep": (not isolate) and uid is not None}
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        total = n * (limits.wall_s + 0.5) + 10.0
        proc = subprocess.Popen([python, "-I", "-S", "-B", str(_LAUNCHER), json.dumps(args)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=base, env=env, start_new_session=True, close_fds=True)
        try:
            out, err = proc.communicate(json.dumps(spec).encode("utf-8"), timeout=total)
        except subprocess.TimeoutExpired:
            _killpg(proc)
            return _error_run(isolation, n, f"sandbox exceeded its overall wall time ({total:.0f}s)", internal=True)
        finally:
            if not isolate and uid is not None:
                _sweep_uid(python, uid)
        if proc.returncode == NO_SECCOMP_EXIT and limits.seccomp and limits.require_seccomp:
            return _error_run(isolation, n, NO_SECCOMP_MESSAGE, internal=True)
        if proc.returncode != 0:
            msg = err.decode("utf-8", errors="replace")[-2000:].strip()
            return _error_run(isolation, n, f"sandbox failed (rc={proc.returncode}): {msg}", internal=True)
        try:
            report = json.loads(out.decode("utf-8"))
            results = [CaseResult(**r) for r in report["results"]]
            seccomp = bool(report.get("seccomp"))
        except (ValueError, KeyError, TypeError) as e:
            return _error_run(isolation, n, f"bad sandbox report: {e}", internal=True)
        if len(results) != n:
            return _error_run(isolation, n, "sandbox report has the wrong number of results", internal=True)
        if limits.seccomp and not seccomp:  # only when not required: the harness refuses otherwise
            _warn_once("code sandbox: the seccomp filter could not be installed here (kernel without seccomp, or "
                       "an unsupported architecture); running without it (require_seccomp = false): namespaces, "
                       "rlimits and the audit hook remain")
        return SandboxRun(isolation=isolation, results=results, seccomp=seccomp)
    finally:
        shutil.rmtree(base, ignore_errors=True)


_warned: set[str] = set()


def _warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _others_can_run(python: str) -> bool:
    """Whether an arbitrary uid can execute ``python`` and read its stdlib (parents searchable)."""
    stdlib = os.path.realpath(os.path.dirname(os.__file__))
    for target, need in ((python, 0o005), (stdlib, 0o005)):
        p = Path(target)
        try:
            if p.stat().st_mode & need != need:
                return False
            for parent in p.parents:
                if parent.stat().st_mode & 0o001 == 0:
                    return False
        except OSError:
            return False
    return True


def _killpg(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.communicate(timeout=10)
    except (subprocess.TimeoutExpired, ValueError, OSError):
        pass


def _sweep_uid(python: str, uid: int) -> None:
    """Kill every process of the sandbox's private uid (the no-namespace fallback, as root)."""
    code = f"import os\nos.setgroups([]);os.setgid({uid});os.setuid({uid})\ntry: os.kill(-1, 9)\nexcept OSError: pass"
    try:
        subprocess.run([python, "-I", "-S", "-c", code], timeout=10, env={"PATH": "/usr/bin:/bin"},
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (subprocess.TimeoutExpired, OSError):
        pass

