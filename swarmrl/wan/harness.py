"""``Harness``: a run's network namespaces, links and wire, set up on entry and removed on exit.

The layout is a star: a core namespace (``<prefix>-hub``, IP forwarding on) and one namespace per role
(``<prefix>-<role>``), each joined to the core by its access link: role side ``wan0`` at 169.254.L.2, core side
``lL`` at 169.254.L.1 (L = the role's index + 1), a route to 169.254.0.0/16 through the core and no other. A
link with neither delay nor loss is a veth pair; any other is a pair of TUN devices joined by the user-space
wire (``swarmrl.wan.wire``); a rate is a token bucket filter on both ends. The wire process is started for every
harness (with no link to carry, it only keeps watch): it dies with the harness's process and removes the
namespaces as it goes, so even a SIGKILLed launcher leaves nothing behind; a later harness removes the
namespaces of launchers that are gone (``netns.clean_stale``) too.

Names carry a per-run prefix ``swrl<pid>x<4 hex>``; addresses are link-local and exist only in these
namespaces: the machine's own namespace gets no address, route or link of the harness's.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from swarmrl.utils.procs import child_env
from swarmrl.wan import netns
from swarmrl.wan.netns import ip
from swarmrl.wan.profiles import Link, link_plan

MAX_ROLES = 254


class Harness:
    """Namespaces and links for ``links`` (role -> Link, in order). ``hosts``: each role's address; ``netns``:
    each role's namespace; ``seed`` seeds the links' losses; ``max_s`` bounds the harness's life."""

    def __init__(self, links: dict[str, Link], seed: int = 0, max_s: float = 86400.0,
                 log: Path | None = None, prefix: str | None = None) -> None:
        if not links or len(links) > MAX_ROLES:
            raise ValueError(f"a harness holds 1 to {MAX_ROLES} roles, not {len(links)}")
        bad = [r for r in links if not r.replace("-", "").replace("_", "").isalnum()]
        if bad:
            raise ValueError(f"role names must be letters, digits, - and _: {bad}")
        self.links = dict(links)
        self.seed, self.max_s, self.log = seed, max_s, log
        self.prefix = prefix or f"swrl{os.getpid()}x{secrets.token_hex(2)}"
        self.hub = f"{self.prefix}-hub"
        self.index = {role: i + 1 for i, role in enumerate(self.links)}
        self.netns = {role: f"{self.prefix}-{role}" for role in self.links}
        self.hosts = {role: f"169.254.{i}.2" for role, i in self.index.items()}
        self.wire: subprocess.Popen | None = None
        self._made: list[str] = []

    @classmethod
    def for_profile(cls, profile: str, roles: list[str], overrides: dict[str, str] | None = None,
                    **kw: object) -> Harness:
        return cls(link_plan(profile, roles, overrides), **kw)

    # ---- set-up ------------------------------------------------------------------------------------------------
    def up(self) -> Harness:
        netns.check_rights()
        netns.clean_stale()
        try:
            self._make_namespaces()
            self._start_wire()
            for role in self.links:
                self._configure(role)
        except BaseException:
            self.down()
            raise
        return self

    def _make_namespaces(self) -> None:
        for ns in [self.hub, *self.netns.values()]:
            netns.add(ns)
            self._made.append(ns)
        with netns.inside(self.hub):
            Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
        for role, link in self.links.items():
            ns, core = self.netns[role], f"l{self.index[role]}"
            if link.wired:
                ip("tuntap", "add", "dev", "wan0", "mode", "tun", ns=ns)
                ip("tuntap", "add", "dev", core, "mode", "tun", ns=self.hub)
            else:
                ip("link", "add", "wan0", "type", "veth", "peer", "name", core, "netns", self.hub, ns=ns)

    def _configure(self, role: str) -> None:
        link, ns, i = self.links[role], self.netns[role], self.index[role]
        core = f"l{i}"
        for where, dev, addr in ((ns, "wan0", f"169.254.{i}.2"), (self.hub, core, f"169.254.{i}.1")):
            ip("link", "set", dev, "mtu", str(link.mtu), ns=where)
            ip("addr", "add", f"{addr}/24", "dev", dev, ns=where)
            ip("link", "set", dev, "up", ns=where)
            if link.rate_mbit:
                _tc(where, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{link.rate_mbit:g}mbit",
                    "burst", str(link.burst_bytes()), "latency", "100ms")
        ip("route", "add", "169.254.0.0/16", "via", f"169.254.{i}.1", "dev", "wan0", ns=ns)

    def _start_wire(self) -> None:
        spec = {"links": [{"a_ns": self.netns[r], "a_dev": "wan0", "b_ns": self.hub, "b_dev": f"l{self.index[r]}",
                           "delay_s": link.rtt_ms / 2000.0, "loss": link.loss, "seed": self.seed * 1000 + i}
                          for i, (r, link) in enumerate(self.links.items()) if link.wired],
                "cleanup": list(self._made), "max_s": self.max_s}
        fd, path = tempfile.mkstemp(prefix="swarmrl-wire-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(spec, f)
        err = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.wire = subprocess.Popen([sys.executable, "-m", "swarmrl.wan.wire", path], stdout=subprocess.PIPE,
                                         stderr=err, env=child_env(os.environ), start_new_session=True)
            line = _read_line(self.wire, 60.0)
        finally:
            os.unlink(path)
            if err is not subprocess.DEVNULL:
                err.close()
        if line != "ready":
            raise RuntimeError(f"the network wire did not start ({line!r}; exit {self.wire.poll()})")

    # ---- tear-down ---------------------------------------------------------------------------------------------
    def down(self) -> None:
        """Stop the wire (it removes the namespaces) and remove whatever is left; safe to call twice."""
        if self.wire is not None:
            if self.wire.poll() is None:
                self.wire.terminate()
                try:
                    self.wire.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.wire.kill()
                    self.wire.wait()
            if self.wire.stdout is not None:
                self.wire.stdout.close()
            self.wire = None
        for ns in reversed(self._made):
            netns.delete(ns)
        self._made = []

    def __enter__(self) -> Harness:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def describe(self) -> dict[str, dict]:
        return {role: {"netns": self.netns[role], "host": self.hosts[role], "link": link.describe()}
                for role, link in self.links.items()}


def _tc(ns: str, *args: str) -> None:
    argv = ["tc", "-n", ns, *args]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")


def _read_line(p: subprocess.Popen, timeout_s: float) -> str:
    """The first line ``p`` prints, within ``timeout_s`` ("" if it ends first or times out)."""
    assert p.stdout is not None
    deadline = time.monotonic() + timeout_s
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([p.stdout], [], [], left)[0]:
            return ""
        chunk = os.read(p.stdout.fileno(), 4096)
        if not chunk:
            return ""
        buf += chunk
    return buf.split(b"\n", 1)[0].decode(errors="replace").strip()
