"""Network namespace primitives for the harness: the rights check, creating and removing named namespaces
(``ip netns``), running a command in one, moving this thread or process into one (``setns``), and removing the
namespaces of runs that died without cleaning up."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

NETNS_DIR = Path("/run/netns")
NETNS_ENV = "SWARMRL_NETNS"  # a role started by ``swarmrl run`` under a profile enters this namespace first
CLONE_NEWNET = 0x40000000
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21
# every namespace the harness makes: swrl<launcher pid>x<4 hex>-<role>; the pid tells a stale one
PREFIX_RE = re.compile(r"^swrl(\d+)x[0-9a-f]{4}-")


class WanUnavailable(RuntimeError):
    """The harness cannot run here (no CAP_NET_ADMIN / CAP_SYS_ADMIN, no ``ip``, no TUN device)."""


def _caps() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def check_rights() -> None:
    """``WanUnavailable`` with the reason unless this process may make network namespaces, links and TUN devices.
    The capability bits are read first; a process that has them only in a user namespace of its own (``unshare
    -U``) is caught by a probe namespace that it cannot make."""
    caps = _caps()
    missing = [n for n, bit in (("CAP_NET_ADMIN", CAP_NET_ADMIN), ("CAP_SYS_ADMIN", CAP_SYS_ADMIN))
               if not caps >> bit & 1]
    if missing:
        raise WanUnavailable(f"the network harness needs {' and '.join(missing)} (run it as root); it makes network "
                             "namespaces, veth links and TUN devices")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise WanUnavailable(f"the network harness needs `{tool}` (iproute2)")
    if not Path("/dev/net/tun").exists():
        raise WanUnavailable("the network harness needs /dev/net/tun for its delaying links")
    probe = f"swrl{os.getpid()}x0000-probe"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        raise WanUnavailable(f"cannot make a network namespace here ({r.stderr.strip() or r.returncode}); the "
                             "network harness needs CAP_NET_ADMIN and CAP_SYS_ADMIN in the machine's own namespaces")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)


def rights_problem() -> str:
    """Why this process cannot run the harness (``check_rights``'s reason), or "" when it can."""
    try:
        check_rights()
    except WanUnavailable as e:
        return str(e)
    return ""


def ip(*args: str, ns: str | None = None) -> str:
    """``ip [-n ns] args...``; its stdout, or ``RuntimeError`` with its stderr."""
    argv = ["ip", *(["-n", ns] if ns else []), *args]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r.stdout


def run_in(ns: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """``argv`` run inside namespace ``ns`` (``ip netns exec``), bounded to 30 s."""
    r = subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"in {ns}: {' '.join(argv)}: {r.stderr.strip()}")
    return r


def exists(ns: str) -> bool:
    return (NETNS_DIR / ns).exists()


def add(ns: str) -> None:
    ip("netns", "add", ns)
    ip("link", "set", "lo", "up", ns=ns)


def delete(ns: str) -> None:
    if exists(ns):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def listed(prefix: str = "swrl") -> list[str]:
    return sorted(p.name for p in NETNS_DIR.glob(f"{prefix}*")) if NETNS_DIR.is_dir() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale() -> list[str]:
    """Remove the harness's namespaces whose launcher (the pid in their name) is gone; returns their names."""
    gone = []
    for name in listed():
        m = PREFIX_RE.match(name)
        if m and not _alive(int(m.group(1))):
            delete(name)
            gone.append(name)
    return gone


_libc = None


def _setns(fd: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def enter(ns: str) -> None:
    """Move the calling thread (the whole process when it has one thread: do it first) into namespace ``ns``;
    sockets it opens from now on live there."""
    fd = os.open(NETNS_DIR / ns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(fd)
    finally:
        os.close(fd)


def enter_from_env(environ: dict | None = None) -> None:
    """At a role's start: enter the namespace ``SWARMRL_NETNS`` names, if any (the variable is removed, so the
    role's own children do not look for it again)."""
    env = os.environ if environ is None else environ
    ns = env.pop(NETNS_ENV, None)
    if ns:
        enter(ns)


@contextmanager
def inside(ns: str) -> Iterator[None]:
    """This thread inside ``ns`` for the block (its sockets opened there stay there), then back where it was."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        enter(ns)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(home)
