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
NO_SECCOMP_EXIT = 124  # swarmrl.envs.sandbox.NO_SECCOMP_EXIT: the filter is required and does not install

# seccomp: system calls an untrusted program never needs, denied in each case's process (kill the process, so
# the harness sees SIGSYS and reports it). (x86_64, aarch64) numbers. socket() is killed too except for AF_UNIX,
# which gets EACCES: glibc asks nscd over a unix socket on any user lookup (pwd.getpwuid), and must just fail.
DENIED_SYSCALLS = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431),
    "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "bpf": (321, 280), "keyctl": (250, 219),
    "add_key": (248, 217), "request_key": (249, 218), "perf_event_open": (298, 241), "unshare": (272, 97),
    "setns": (308, 268), "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "reboot": (169, 142), "swapon": (167, 224), "swapoff": (168, 225), "userfaultfd": (323, 282),
    "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264), "acct": (163, 89), "quotactl": (179, 60),
    "lookup_dcookie": (212, 18), "io_uring_setup": (425, 425), "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
}
SYS_CLONE, SYS_CLONE3 = {"x86_64": (56, 435), "aarch64": (220, 435)}.get(os.uname().machine, (None, None))
SYS_SOCKET = {"x86_64": 41, "aarch64": 198}.get(os.uname().machine)
AF_UNIX, EACCES = 1, 13
CLONE_NEW_ANY = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET: new namespaces via clone()
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}.get(os.uname().machine)
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
ENOSYS = 38


def seccomp_program():
    """The classic-BPF filter: [(code, jt, jf, k)]. Other ABIs (i386 via int 0x80, x32) are killed outright;
    clone3 gets ENOSYS (its flags sit behind a pointer; libc falls back to clone, whose flags are checked)."""
    arm = os.uname().machine == "aarch64"
    nrs = sorted({v[1] if arm else v[0] for v in DENIED_SYSCALLS.values()})
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    prog = [("ld", 4), ("jeq_else", AUDIT_ARCH, "kill"), ("ld", 0)]
    if not arm:
        prog.append(("jge", 0x40000000, "kill"))  # the x32 ABI: same numbers with bit 30 set
    prog += [("jeq", nr, "kill") for nr in nrs]
    prog += [("jeq", SYS_CLONE3, "enosys"), ("jeq", SYS_SOCKET, "socket"), ("jeq_else", SYS_CLONE, "allow"),
             ("ld", 16), ("jset", CLONE_NEW_ANY, "kill"), ("label", "allow"), ("ret", RET_ALLOW),
             ("label", "socket"), ("ld", 16), ("jeq_else", AF_UNIX, "kill"), ("ret", RET_ERRNO | EACCES),
             ("label", "enosys"), ("ret", RET_ERRNO | ENOSYS), ("label", "kill"), ("ret", RET_KILL_PROCESS)]
    labels, pc = {}, 0
    for ins in prog:
        if ins[0] == "label":
            labels[ins[1]] = pc
        else:
            pc += 1
    out, pc = [], 0
    for ins in prog:
        op = ins[0]
        if op == "label":
            continue
        if op == "ld":
            out.append((ld, 0, 0, ins[1]))
        elif op == "ret":
            out.append((ret, 0, 0, ins[1]))
        else:
            off = labels[ins[2]] - pc - 1
            code = {"jeq": jeq, "jeq_else": jeq, "jge": jge, "jset": jset}[op]
            out.append((code, 0, off, ins[1]) if op == "jeq_else" else (code, off, 0, ins[1]))
        pc += 1
    return out


def install_seccomp():
    """Install the filter in this process (needs no_new_privs, which the launcher set). Returns an error or None."""
    import ctypes  # noqa: PLC0415  # lazy: sandbox

    if AUDIT_ARCH is None or SYS_CLONE is None or SYS_SOCKET is None:
        return f"seccomp: unsupported architecture {os.uname().machine}"

    class Insn(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Insn))]

    ins = seccomp_program()
    arr = (Insn * len(ins))(*[Insn(*i) for i in ins])
    prog = Prog(len(ins), ctypes.cast(arr, ctypes.POINTER(Insn)))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(22, 2, ctypes.addressof(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        return f"seccomp: {os.strerror(ctypes.get_errno())}"
    return None


def seccomp_works():
    """Whether the filter installs here (probed once, in a throwaway child)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0 if install_seccomp() is None else 1)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


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
    import resource  # noqa: PLC0415  # lazy: sandbox

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
        sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)
        cpu = int(spec["cpu_s"])
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_FSIZE, (spec["out_bytes"], spec["out_bytes"]))
        program = compile(spec["program"], "solution.py", "exec")
        extra = None
        if mode == "function":
            extra = compile(spec.get("prelude", "") + "\n" + case["test"], "tests.py", "exec")
        if spec.get("seccomp"):
            why = install_seccomp()
            if why is not None:  # it installed in the probe: fail closed
                os.write(2, f"sandbox: {why}\n".encode())
                os._exit(126)
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
            import traceback  # noqa: PLC0415  # lazy: sandbox

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
    import select  # noqa: PLC0415  # lazy: sandbox

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
    import shutil  # noqa: PLC0415  # lazy: sandbox

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
        import ctypes  # noqa: PLC0415  # lazy: sandbox

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE=0: same-uid children cannot ptrace us
    except Exception:  # noqa: BLE001
        pass
    report_fd = os.dup(1)
    spec = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    wanted = bool(spec.get("seccomp"))
    spec["seccomp"] = wanted and seccomp_works()
    if wanted and not spec["seccomp"] and spec.get("require_seccomp", True):  # fail closed: no program runs
        sys.stderr.write("sandbox: the seccomp filter cannot be installed here\n")
        sys.stderr.flush()
        os._exit(NO_SECCOMP_EXIT)
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
        denied = spec["seccomp"] and status == "signal" and code == signal.SIGSYS
        if denied:
            err = (err + "\nsandbox: killed by the seccomp filter (a denied system call)")[-STDERR_TAIL:]
        results.append({"status": status, "code": code, "completed": completed, "stdout": out,
                        "stdout_truncated": out_trunc, "stderr": err, "ret": ret, "denied_syscall": denied})
    clean_work(work)
    if spec.get("sweep"):
        try:  # every other process of this sandbox's private uid (the no-namespace fallback)
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        reap()
    os.write(report_fd, json.dumps({"results": results, "seccomp": spec["seccomp"]}).encode())
    os.close(report_fd)


main()
