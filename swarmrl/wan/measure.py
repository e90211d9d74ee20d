"""What a harness's links really give, measured between two role namespaces through the core (never over
loopback): TCP round trips (one byte echoed) and TCP throughput (a bulk transfer, timed until the receiver has
every byte). Every loop is bounded in count and every socket in time."""

from __future__ import annotations

import socket
import statistics
import threading
import time

from swarmrl.wan import netns
from swarmrl.wan.harness import Harness

MAX_PINGS = 1000
MAX_BYTES = 1 << 30


def _listen(h: Harness, role: str) -> socket.socket:
    with netns.inside(h.netns[role]):
        s = socket.create_server((h.hosts[role], 0))
    s.settimeout(60.0)
    return s


def _connect(h: Harness, src: str, dst: str, port: int, timeout_s: float) -> socket.socket:
    with netns.inside(h.netns[src]):
        c = socket.create_connection((h.hosts[dst], port), timeout=timeout_s)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c


def rtt_ms(h: Harness, src: str, dst: str, n: int = 20, timeout_s: float = 30.0) -> dict:
    """Round trips of one byte from ``src`` to a TCP echo in ``dst``: median, min, max in ms."""
    n = max(1, min(n, MAX_PINGS))
    srv = _listen(h, dst)

    def echo() -> None:
        try:
            conn, _ = srv.accept()
            with conn:
                conn.settimeout(timeout_s)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                for _ in range(n):
                    b = conn.recv(1)
                    if not b:
                        return
                    conn.sendall(b)
        except OSError:
            pass

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    times = []
    try:
        with _connect(h, src, dst, srv.getsockname()[1], timeout_s) as c:
            for _ in range(n):
                t0 = time.perf_counter()
                c.sendall(b"x")
                if c.recv(1) != b"x":
                    raise RuntimeError("echo broke off")
                times.append(1000 * (time.perf_counter() - t0))
    finally:
        srv.close()
        t.join(timeout_s)
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "n": n}


def throughput_mbit(h: Harness, src: str, dst: str, nbytes: int = 4 << 20, timeout_s: float = 120.0) -> dict:
    """``nbytes`` sent from ``src`` to ``dst`` over one TCP connection: megabits per second from the connect to the
    receiver holding the last byte (its one-byte acknowledgement back is subtracted as half a round trip's no
    more: it is counted, so the figure is a slight underestimate on long links)."""
    nbytes = max(1, min(nbytes, MAX_BYTES))
    srv = _listen(h, dst)
    got = {"bytes": 0}

    def sink() -> None:
        try:
            conn, _ = srv.accept()
            with conn:
                conn.settimeout(timeout_s)
                while got["bytes"] < nbytes:
                    b = conn.recv(1 << 16)
                    if not b:
                        return
                    got["bytes"] += len(b)
                conn.sendall(b"k")
        except OSError:
            pass

    t = threading.Thread(target=sink, daemon=True)
    t.start()
    chunk = b"\0" * (1 << 16)
    try:
        t0 = time.perf_counter()
        with _connect(h, src, dst, srv.getsockname()[1], timeout_s) as c:
            left = nbytes
            while left > 0:
                c.sendall(chunk[:min(left, len(chunk))])
                left -= min(left, len(chunk))
            c.recv(1)
            dt = time.perf_counter() - t0
    finally:
        srv.close()
        t.join(timeout_s)
    if got["bytes"] < nbytes:
        raise RuntimeError(f"only {got['bytes']} of {nbytes} bytes arrived")
    return {"mbit_s": nbytes * 8 / dt / 1e6, "seconds": dt, "bytes": nbytes}
