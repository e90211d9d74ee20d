"""Connection limits shared by the public servers (the orchestrator under uvicorn, SHARDCAST under aiohttp), and
``gather_capped``, the size-capped body read of the FastAPI ones (the DiLoCo aggregator, the inference server).

Against slowloris (many connections that send half a request and wait) and plain connection hoarding:

* a cap on open connections per source address (IPv6: per /64) and on all connections of the process, the
  latter clipped to what ``RLIMIT_NOFILE`` leaves after a headroom for the process's own files;
* ``reserved`` of those slots only for addresses that recently made a request the server vouched for
  (``trust``: a signed, authenticated call on the orchestrator; a successful GET on SHARDCAST), so an
  attacker filling every other slot from many addresses still leaves room for registered nodes;
* deadlines (enforced by the server adapters, ``swarmrl.protocol.orchestrator.guard`` and
  ``swarmrl.shardcast.server.guard``): a request head must arrive within ``header_timeout_s`` of the connection
  being idle, its body within ``body_timeout_s``, and an idle keep-alive connection is closed after
  ``idle_timeout_s``.

This module holds the accounting only (no server imports); everything runs on the server's event loop except
``trust``, which request handlers may call from worker threads.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import resource
import threading
import time
from collections import Counter
from collections.abc import AsyncIterable
from dataclasses import dataclass
from typing import Any

__all__ = ["ConnLimits", "ConnectionGuard", "raise_nofile_limit", "peer_key", "REFUSED_RESPONSE", "TRUST_EXTENSION"]

log = logging.getLogger("swarmrl.serving")

# ASGI scope extension under which the orchestrator's serving layer hands the app a no-argument callable that
# marks the connection's source address as trusted (called once a request was authenticated).
TRUST_EXTENSION = "swarmrl.trust_peer"

_REFUSED_BODY = b"too many connections\n"
REFUSED_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\nretry-after: 1\r\n"
                    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_REFUSED_BODY), _REFUSED_BODY))
LOG_EVERY_S = 10.0
MAX_TRUSTED = 1 << 16  # addresses remembered at once (oldest forgotten first)


async def gather_capped(chunks: AsyncIterable[bytes], limit: int) -> bytes | None:
    """A request body streamed in ``chunks`` (e.g. Starlette's ``request.stream()``), joined; None as soon as more
    than ``limit`` bytes came, whatever Content-Length said (the rest is not read)."""
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


@dataclass(frozen=True)
class ConnLimits:
    max_connections: int = 16384  # per process; clipped to RLIMIT_NOFILE minus headroom
    max_connections_per_ip: int = 64  # per source address (IPv6: per /64)
    reserved_connections: int = 1024  # of max_connections, kept for recently trusted addresses
    trusted_ttl_s: float = 600.0  # how long an address stays trusted after its last vouched-for request
    header_timeout_s: float = 10.0  # a request head must be complete this long after the connection went idle
    body_timeout_s: float = 120.0  # and its body this long after the head
    idle_timeout_s: float = 5.0  # keep-alive connections idle this long are closed
    backlog: int = 4096  # listen backlog (the kernel caps it at net.core.somaxconn)

    @classmethod
    def from_config(cls, cfg: Any, **defaults: Any) -> ConnLimits:
        """The limits named like this class's fields on ``cfg`` (a config model), ``defaults`` for the rest."""
        kw = dict(defaults)
        for f in dataclasses.fields(cls):
            if hasattr(cfg, f.name):
                kw[f.name] = getattr(cfg, f.name)
        return cls(**kw)


_nofile_logged = False


def is_wildcard(host: str) -> bool:
    """Whether listening on ``host`` means every address (0.0.0.0, ::, in brackets or not): an address to listen
    on that names no machine to connect to."""
    return host.strip().strip("[]") in ("0.0.0.0", "::")


def raise_nofile_limit() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (every socket is a file); returns (soft, hard)."""
    global _nofile_logged
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("could not raise RLIMIT_NOFILE from %d to %d: %s", soft, target, e)
    if not _nofile_logged:
        _nofile_logged = True
        log.info("open files limit (RLIMIT_NOFILE): soft %d, hard %s", soft,
                 "unlimited" if hard == resource.RLIM_INFINITY else hard)
    return soft, hard


def fd_headroom(soft: int) -> int:
    """File descriptors kept for the process's own files, logs, database and threads."""
    return max(64, soft // 8)


def peer_key(peername: Any) -> str:
    """The address a connection counts against: the IPv4 address, or the /64 of an IPv6 one."""
    if not peername:
        return "?"
    ip = peername[0] if isinstance(peername, tuple) else str(peername)
    if ":" not in ip:
        return ip
    if ip.startswith("::ffff:") and "." in ip:
        return ip[7:]
    try:
        return str(ipaddress.IPv6Network((ip.split("%", 1)[0], 64), strict=False))
    except ValueError:
        return ip


class ConnectionGuard:
    """Admission and trust bookkeeping of one server process. ``admit``/``release`` on the event loop."""

    def __init__(self, limits: ConnLimits | None = None, name: str = "server", nofile: int | None = None) -> None:
        self.limits = limits = limits or ConnLimits()
        self.name = name
        soft = nofile if nofile is not None else resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            soft = 1 << 20
        self.max_total = max(1, min(limits.max_connections, soft - fd_headroom(soft)))
        self.reserved = min(limits.reserved_connections, self.max_total // 2)
        self.open = 0
        self.peak = 0
        self.by_ip: dict[str, int] = {}
        self.counters: Counter[str] = Counter()
        self._trusted: dict[str, float] = {}  # address -> expiry (monotonic), in order of last refresh
        self._lock = threading.Lock()
        self._last_log = 0.0
        log.info("%s: at most %d connections (%d reserved for trusted addresses), %d per address; deadlines: "
                 "head %.1fs, body %.1fs, idle %.1fs", name, self.max_total, self.reserved,
                 limits.max_connections_per_ip, limits.header_timeout_s, limits.body_timeout_s,
                 limits.idle_timeout_s)

    # pickled into uvicorn worker processes (each worker keeps its own counts)
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # ---- admission -----------------------------------------------------------------------------
    def admit(self, ip: str) -> bool:
        """Count a new connection from ``ip``, or say no (the caller then refuses it at once)."""
        n = self.by_ip.get(ip, 0)
        why = None
        if n >= self.limits.max_connections_per_ip:
            why = "refused_per_ip"
        elif self.open >= self.max_total:
            why = "refused_full"
        elif self.open >= self.max_total - self.reserved and not self.is_trusted(ip):
            why = "refused_reserved"
        if why is not None:
            self.counters[why] += 1
            self._maybe_log()
            return False
        self.by_ip[ip] = n + 1
        self.open += 1
        self.peak = max(self.peak, self.open)
        self.counters["admitted"] += 1
        return True

    def release(self, ip: str) -> None:
        n = self.by_ip.get(ip, 0) - 1
        if n > 0:
            self.by_ip[ip] = n
        else:
            self.by_ip.pop(ip, None)
        self.open = max(0, self.open - 1)

    def timed_out(self, phase: str) -> None:
        """A connection closed for missing a deadline (``phase``: head, body)."""
        self.counters[f"{phase}_timeouts"] += 1
        self._maybe_log()

    # ---- trust ---------------------------------------------------------------------------------
    def trust(self, ip: str) -> None:
        """``ip`` just made a request the server vouches for: it may use the reserved slots for a while."""
        now = time.monotonic()
        with self._lock:
            self._trusted.pop(ip, None)
            self._trusted[ip] = now + self.limits.trusted_ttl_s
            while self._trusted:  # refresh order is expiry order: forget from the front
                k, exp = next(iter(self._trusted.items()))
                if exp >= now and len(self._trusted) <= MAX_TRUSTED:
                    break
                del self._trusted[k]

    def is_trusted(self, ip: str) -> bool:
        with self._lock:
            exp = self._trusted.get(ip)
        return exp is not None and exp >= time.monotonic()

    # ---- reporting -----------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        return {"open": self.open, "peak": self.peak, "addresses": len(self.by_ip), "max": self.max_total,
                "reserved": self.reserved, **self.counters}

    def _maybe_log(self) -> None:
        now = time.monotonic()
        if now - self._last_log >= LOG_EVERY_S:
            self._last_log = now
            log.warning("%s: shedding connections: %s", self.name, self.stats())
