"""Sandbox harness: runs inside the sandbox (already unprivileged), one forked child per test case.

Reads the job spec (JSON) from stdin, writes one JSON report to stdout. The untrusted program only
ever runs in forked children whose stdin/stdout/stderr are files in the work dir; the harness
never runs untrusted code itself, so stdin/stdout verdicts (compared by the host, which alone
holds the expected outputs) cannot be forged. Imports only the stdlib; run with -I -S -B -c.
"""

import json
import os
import signal
import sys
import time

IN, OUT, ERR = ".in", ".out", ".err"
HARNESS_FILES = {IN, OUT, ERR}
STDERR_TAIL = 2048


def install_audit_hook(read_roots, write_roots):
    """Second layer (first in the no-namespace fallback): refuse I/O outside the roots, sockets,
    processes, signals and ctypes. Raises PermissionError in the offending call."""
    realpath, fsdecode = os.path.realpath, os.fsdecode
    wflags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    read_roots = tuple(read_roots)
    write_roots = tuple(write_roots)
    blocked = ("socket.", "subprocess.", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.fork",
               "os.forkpty", "os.kill", "os.killpg", "os.pidfd", "ctypes.", "pty.", "os.putenv", "os.unsetenv",
               "sys.remote_exec", "resource.setrlimit", "resource.prlimit", "os.setuid", "os.setgid", "mmap.")
    write_events = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink",
                    "os.link", "os.truncate", "os.utime", "shutil.rmtree", "os.chflags", "os.mkfifo", "os.mknod"}
    # modules that reach processes, sockets or native code without an audit event of their own
    blocked_imports = {"_posixsubprocess", "_ctypes", "ctypes", "_socket", "socket", "subprocess", "pty",
                       "multiprocessing", "_multiprocessing", "mmap", "_xxsubinterpreters", "_testcapi",
                       "_testinternalcapi", "resource", "fcntl", "termios"}
    read_events = {"os.listdir", "os.scandir", "os.chdir", "glob.glob", "os.walk", "os.fwalk", "shutil.copyfile"}

    def inside(p, roots):
        if isinstance(p, int):
            return True
        try:
            q = realpath(fsdecode(p))
        except Exception:  # noqa: BLE001
            return False
        return any(q == r or q.startswith(r + "/") for r in roots)

    def hook(event, args):
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writing = bool(mode and any(c in str(mode) for c in "wax+")) or bool(
                isinstance(flags, int) and flags & wflags)
            if path is not None and not inside(path, write_roots if writing else read_roots):
                raise PermissionError(f"sandbox: open({path!r}) denied")
        elif event == "import":
            if args and str(args[0]).split(".")[0] in blocked_imports:
                raise PermissionError(f"sandbox: import {args[0]} denied")
        elif event.startswith(blocked):
            raise PermissionError(f"sandbox: {event} denied")
        elif event in write_events:
            for p in args[:2]:
                if isinstance(p, (str, bytes, os.PathLike)) and not inside(p, write_roots):
                    raise PermissionError(f"sandbox: {event}({p!r}) denied")
        elif event in read_events:
            p = args[0] if args else "."
            if isinstance(p, (str, bytes, os.PathLike)) and not inside(p, read_roots):
                raise PermissionError(f"sandbox: {event}({p!r}) denied")

    for name in list(sys.modules):  # forget what the harness itself loaded, so re-imports are seen
        if name.split(".")[0] in blocked_imports:
            del sys.modules[name]
    sys.addaudithook(hook)


def run_child(spec, case, work, res_w, nonce):
    """In the forked child: become the test case. Never returns."""
    import resource

    mode = spec["mode"]
    try:
        os.setpgid(0, 0)
        fd_in = os.open(os.path.join(work, IN), os.O_RDONLY)
        fd_out = os.open(os.path.join(work, OUT), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        fd_err = os.open(os.path.join(work, ERR), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd_in, 0)
        os.dup2(fd_out, 1)
        os.dup2(fd_err, 2)
        keep = res_w
        os.closerange(3, keep)
        os.closerange(keep + 1, 1 << 16)
        sys.stdin = open(0, "r", encoding="utf-8", errors="replace", closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)
        cpu = int(spec["cpu_s"])
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_FSIZE, (spec["out_bytes"], spec["out_bytes"]))
        program = compile(spec["program"], "solution.py", "exec")
        extra = None
        if mode == "function":
            extra = compile(spec.get("prelude", "") + "\n" + case["test"], "tests.py", "exec")
        if spec["audit"]:
            install_audit_hook(spec["read_roots"], spec["write_roots"])
        del spec
        # -S leaves out site, which is what defines exit()/quit(); solutions often call them
        ns = {"__name__": "__main__" if mode == "stdio" else "solution", "__builtins__": __builtins__,
              "exit": sys.exit, "quit": sys.exit}
        exec(program, ns)
        payload = b""
        if mode == "function":
            exec(extra, ns)
        elif mode == "call":
            fn = ns[case["fn_name"]]
            payload = json.dumps(fn(*case["args"])).encode()[:60000]
        sys.stdout.flush()
        os.write(res_w, nonce + payload)
        os._exit(0)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        try:
            sys.stdout.flush()
            if code == 0 and mode == "stdio":
                os.write(res_w, nonce)
        except BaseException:  # noqa: BLE001
            pass
        os._exit(code & 0xFF)
    except BaseException:  # noqa: BLE001
        try:
            import traceback

            traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass
        os._exit(1)


def wait_child(pid, wall_s):
    """(status, code): status in ok/exit/signal/timeout."""
    deadline = time.monotonic() + wall_s
    pidfd = None
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    import select

    delay = 0.001
    try:
        while True:
            wpid, status = os.waitpid(pid, os.WNOHANG)
            if wpid:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
                os.waitpid(pid, 0)
                return "timeout", None
            if pidfd is not None:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(min(delay, left))
                delay = min(delay * 2, 0.01)
    finally:
        if pidfd is not None:
            os.close(pidfd)
    try:  # the case's leftovers (background processes in its group)
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    if os.WIFSIGNALED(status):
        return "signal", os.WTERMSIG(status)
    code = os.WEXITSTATUS(status)
    return ("ok" if code == 0 else "exit"), code


def read_capped(path, cap, tail=False):
    try:
        with open(path, "rb") as f:
            if tail:
                size = os.fstat(f.fileno()).st_size
                f.seek(max(0, size - cap))
            data = f.read(cap + 1)
    except OSError:
        return "", False
    return data[:cap].decode("utf-8", errors="replace"), len(data) > cap


def clean_work(work):
    import shutil

    for name in os.listdir(work):
        p = os.path.join(work, name)
        try:
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.unlink(p)
        except OSError:
            pass


def reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main():
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE=0: same-uid children cannot ptrace us
    except Exception:  # noqa: BLE001
        pass
    report_fd = os.dup(1)
    spec = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    work = os.getcwd()
    results = []
    for case in spec["cases"]:
        clean_work(work)
        with open(os.path.join(work, IN), "w", encoding="utf-8") as f:
            f.write(case.get("input", ""))
        res_r, res_w = os.pipe()
        nonce = os.urandom(16).hex().encode()
        pid = os.fork()
        if pid == 0:
            os.close(res_r)
            run_child(spec, case, work, res_w, nonce)
        os.close(res_w)
        status, code = wait_child(pid, float(spec["wall_s"]))
        os.set_blocking(res_r, False)
        try:
            got = os.read(res_r, 65536)
        except OSError:
            got = b""
        os.close(res_r)
        reap()
        completed = got.startswith(nonce)
        out, out_trunc = read_capped(os.path.join(work, OUT), spec["out_bytes"])
        err, _ = read_capped(os.path.join(work, ERR), STDERR_TAIL, tail=True)
        ret = got[len(nonce):].decode("utf-8", errors="replace") if completed else None
        if status == "ok" and not completed:
            status = "exit"  # exited 0 without finishing (e.g. os._exit(0) before the tests ran)
        results.append({"status": status, "code": code, "completed": completed, "stdout": out,
                        "stdout_truncated": out_trunc, "stderr": err, "ret": ret})
    clean_work(work)
    if spec.get("sweep"):
        try:  # every other process of this sandbox's private uid (the no-namespace fallback)
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        reap()
    os.write(report_fd, json.dumps({"results": results}).encode())
    os.close(report_fd)


main()
