"""SHARDCAST's serving layer under aiohttp: connection caps and read deadlines (``swarmrl.utils.serving``).

``listen`` opens the listening socket with ``GuardedConnection`` as the protocol: it admits or refuses each
connection (per-address and global caps, a reserve for addresses that recently got a successful answer) before
aiohttp builds its request handler, and closes a connection whose first request head is not complete within
``header_timeout_s``. Later requests on a kept-alive connection are bounded by aiohttp's ``keepalive_timeout``
(``idle_timeout_s``), which closes a connection that has not sent a complete request head that long after its
last response. The app's middleware reports each dispatched request with ``request_started`` and each
successful one with ``trust``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from swarmrl.utils.serving import REFUSED_RESPONSE, ConnectionGuard, peer_key

__all__ = ["GuardedConnection", "listen", "request_started", "trust"]


class GuardedConnection(asyncio.Protocol):
    """Wraps aiohttp's per-connection handler, built only once the connection is admitted."""

    def __init__(self, make_handler: Callable[[], asyncio.Protocol], guard: ConnectionGuard) -> None:
        self._make, self.guard = make_handler, guard
        self.inner: Any = None
        self.ip: str | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        ip = peer_key(transport.get_extra_info("peername"))
        if not self.guard.admit(ip):
            transport.write(REFUSED_RESPONSE)  # type: ignore[attr-defined]
            transport.close()
            return
        self.ip, self._transport = ip, transport  # type: ignore[assignment]
        self.inner = self._make()
        self.inner.connection_made(transport)
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(self.guard.limits.header_timeout_s, self._expired)

    def request_started(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self._transport is not None and not self._transport.is_closing():
            self.guard.timed_out("head")
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.inner is None or self.ip is None:
            return
        self.request_started()
        self.guard.release(self.ip)
        self.ip = None
        self.inner.connection_lost(exc)


def _connection(request: web.BaseRequest) -> GuardedConnection | None:
    transport = request.transport
    proto = transport.get_protocol() if transport is not None else None
    return proto if isinstance(proto, GuardedConnection) else None


def request_started(request: web.BaseRequest) -> None:
    """A request head arrived on this connection: its first-head deadline no longer applies."""
    conn = _connection(request)
    if conn is not None:
        conn.request_started()


def trust(request: web.BaseRequest) -> None:
    """The request was answered successfully: its address may use the reserved connections for a while."""
    conn = _connection(request)
    if conn is not None and conn.ip is not None:
        conn.guard.trust(conn.ip)


async def listen(runner: web.AppRunner, guard: ConnectionGuard, host: str, port: int) -> asyncio.AbstractServer:
    """Listen on host:port for ``runner`` (set up) behind ``guard``; close the returned server before cleanup."""
    server = runner.server
    assert server is not None, "runner.setup() first"
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: GuardedConnection(server, guard), host, port,
                                    backlog=guard.limits.backlog, reuse_address=True)
