"""Sandbox launcher: runs as the caller (root, or a plain user), sets up isolation, then execs the
harness. Run as ``python -I -S -B _sandbox_launcher.py ARGS_JSON``; the job spec arrives on stdin
and is read by the harness, whose JSON report goes to stdout. Imports only the stdlib.

With ``isolate`` (see ``swarmrl.envs.sandbox`` for the full description):
  unshare(mount, net, pid, ipc, uts [+ user when not root]) -> fork (child is pid 1 of the new pid
  namespace, with PDEATHSIG=SIGKILL) -> private tmpfs root holding read-only binds of the
  interpreter's directories, /dev/{null,zero,urandom,random}, writable /work and /tmp -> pivot_root
  and detach the old root -> rlimits -> drop to an unprivileged uid (root) or drop all capabilities
  (user namespace) -> no_new_privs -> exec the harness.
Without it: rlimits, drop to the unprivileged uid when root, exec the harness in a host temp dir.
"""

import ctypes
import json
import os
import platform
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(platform.machine())
SYS_CAPSET = {"x86_64": 126, "aarch64": 91}.get(platform.machine())

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.unshare.argtypes = [ctypes.c_int]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def fail(msg: str) -> None:
    sys.stderr.write("sandbox launcher: " + msg + "\n")
    sys.stderr.flush()
    os._exit(125)


def check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        fail(f"{what}: {os.strerror(e)}")


def b(s):
    return None if s is None else s.encode()


def mount(src, dst, fstype, flags, data=None) -> None:
    check(libc.mount(b(src), b(dst), b(fstype), flags, b(data)), f"mount {src} on {dst}")


def set_limits(a: dict, nproc: bool) -> None:
    lim = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_AS, a["mem_bytes"]), (resource.RLIMIT_CPU, a["cpu_s"]),
           (resource.RLIMIT_FSIZE, a["fsize_bytes"]), (resource.RLIMIT_NOFILE, a["nofile"])]
    if a.get("nproc") and nproc:
        lim.append((resource.RLIMIT_NPROC, a["nproc"]))
    for r, v in lim:
        resource.setrlimit(r, (v, v))


def nproc_is_per_userns() -> bool:
    """RLIMIT_NPROC counts per user namespace only since Linux 5.14; before that, in a user namespace
    it would also count all the caller's own processes and threads outside."""
    try:
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (5, 14)


def write_file(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def drop_all_caps() -> None:
    if SYS_CAPSET is None:
        fail("capset: unsupported architecture")
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)(0, 0, 0, 0, 0, 0)
    check(libc.syscall(SYS_CAPSET, header, data), "capset")


def build_root(a: dict) -> None:
    root = a["root"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
          f"size={a['fs_bytes']},nr_inodes=4096,mode=0755")
    for p in a["ro_paths"]:
        if not os.path.lexists(p):
            continue
        target = root + p
        if os.path.islink(p):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if not os.path.lexists(target):
                os.symlink(os.readlink(p), target)
            continue
        os.makedirs(target, exist_ok=True)
        mount(p, target, None, MS_BIND | MS_REC)
        mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.makedirs(root + "/dev", exist_ok=True)
    for d in ("null", "zero", "urandom", "random"):
        t = root + "/dev/" + d
        os.close(os.open(t, os.O_CREAT | os.O_WRONLY, 0o666))
        mount("/dev/" + d, t, None, MS_BIND)
        mount(None, t, None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NOEXEC)
    for d, mode in (("/work", 0o700), ("/tmp", 0o1777)):
        os.makedirs(root + d, exist_ok=True)  # may already hold a bind (an interpreter under /tmp)
        os.chmod(root + d, mode)
        if a["uid"] is not None:
            os.chown(root + d, a["uid"], a["uid"])
    os.chdir(root)
    if SYS_PIVOT_ROOT is None:
        fail("pivot_root: unsupported architecture")
    check(libc.syscall(SYS_PIVOT_ROOT, ctypes.c_char_p(b"."), ctypes.c_char_p(b".")), "pivot_root")
    check(libc.umount2(b".", MNT_DETACH), "detach old root")
    os.chdir("/")


def exec_harness(a: dict, cwd: str, source: str) -> None:
    os.chdir(cwd)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": cwd, "PYTHONHASHSEED": "0"}
    os.execve(a["python"], [a["python"], "-I", "-S", "-B", "-c", source], env)


def drop_uid(a: dict) -> None:
    if a["uid"] is not None:
        os.setgroups([])
        os.setgid(a["uid"])
        os.setuid(a["uid"])
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def die_with_host(a: dict) -> None:
    """SIGKILL when the host process (the role that runs the program) dies: nobody would be left to enforce the
    overall wall time. Set again after a uid change, which clears it; a host already gone ends this at once."""
    host = a.get("host_pid")
    if host is None:
        return
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    if os.getppid() != host:
        fail("the host process is gone")


def main() -> None:
    a = json.loads(sys.argv[1])
    die_with_host(a)
    with open(a["harness"], encoding="utf-8") as f:  # read before the host filesystem disappears
        source = f.read()
    if not a["isolate"]:
        set_limits(a, nproc=a["uid"] is not None)  # a fresh uid's count starts at 1
        drop_uid(a)
        die_with_host(a)  # cleared by setuid
        exec_harness(a, a["workdir"], source)
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    outer_uid, outer_gid = os.getuid(), os.getgid()
    if outer_uid != 0:
        flags |= CLONE_NEWUSER
    check(libc.unshare(flags), "unshare")
    if outer_uid != 0:
        write_file("/proc/self/setgroups", "deny")
        write_file("/proc/self/uid_map", f"0 {outer_uid} 1")
        write_file("/proc/self/gid_map", f"0 {outer_gid} 1")
    pid = os.fork()
    if pid:  # stays outside the new pid namespace; mirrors the child's fate
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, lambda *_: os.kill(pid, signal.SIGKILL))
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
    # pid 1 of the new namespace: dies with the launcher, takes every descendant with it
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    build_root(a)
    set_limits(a, nproc=outer_uid == 0 or nproc_is_per_userns())
    if outer_uid == 0:
        drop_uid(a)
        check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")  # cleared by setuid
    else:
        check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        drop_all_caps()
    exec_harness(a, "/work", source)


if __name__ == "__main__":
    main()
