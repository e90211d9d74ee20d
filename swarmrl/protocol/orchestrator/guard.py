"""The orchestrator's serving layer under uvicorn: connection caps and read deadlines (``swarmrl.utils.serving``).

``GuardedH11Protocol`` is uvicorn's h11 protocol with, per connection:

* admission: beyond the per-address or global cap (or into the reserve without trust) it answers a canned 503
  and closes before reading anything;
* one deadline at a time, by h11's view of the client: waiting for a request head (``header_timeout_s`` from the
  moment the connection went idle, however slowly bytes trickle in), sending a body (``body_timeout_s`` from the
  head); none while the app holds a complete request. Uvicorn's own keep-alive timer (``idle_timeout_s``) still
  closes a silent idle connection first;
* trust: the app gets a ``TRUST_EXTENSION`` callable in the ASGI scope and calls it once a request was
  authenticated, which lets that address use the reserved slots.

``server_config`` builds the uvicorn ``Config``; ``run`` serves one process, or ``workers`` processes (each with
its own guard, built from an environment variable).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import socket
import weakref
from collections.abc import Callable
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from swarmrl.utils.serving import (
    REFUSED_RESPONSE,
    TRUST_EXTENSION,
    ConnectionGuard,
    ConnLimits,
    peer_key,
    raise_nofile_limit,
)

__all__ = ["GuardedH11Protocol", "server_config", "run", "LIMITS_ENV"]

LIMITS_ENV = "SWARMRL_CONN_LIMITS"  # JSON of ConnLimits, for worker processes
_HTTP_CLASS = "swarmrl.protocol.orchestrator.guard:GuardedH11Protocol"
_process_guard: ConnectionGuard | None = None


def _guard_for(config: uvicorn.Config) -> ConnectionGuard:
    """The guard a ``server_config`` carries, else this process's one (worker processes: from LIMITS_ENV)."""
    global _process_guard
    guard = getattr(config, "connection_guard", None)
    if guard is not None:
        return guard
    if _process_guard is None:
        raise_nofile_limit()
        raw = os.environ.get(LIMITS_ENV)
        limits = ConnLimits(**json.loads(raw)) if raw else ConnLimits()
        _process_guard = ConnectionGuard(limits, name=f"orchestrator[{os.getpid()}]")
    return _process_guard


class _TrustHook:
    """ASGI wrapper: puts a callable into the scope that marks the client's address as trusted."""

    def __init__(self, app: Any, guard: ConnectionGuard) -> None:
        self.app, self.guard = app, guard

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("client"):
            scope["extensions"] = {**(scope.get("extensions") or {}),
                                   TRUST_EXTENSION: functools.partial(self.guard.trust, peer_key(scope["client"]))}
        await self.app(scope, receive, send)


# each server's config -> the app wrapped once with its trust hook (gone with the config)
_TRUST_HOOKS: weakref.WeakKeyDictionary[uvicorn.Config, _TrustHook] = weakref.WeakKeyDictionary()


class GuardedH11Protocol(H11Protocol):
    def __init__(self, config: uvicorn.Config, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.guard = _guard_for(config)
        hooked = _TRUST_HOOKS.get(config)
        if hooked is None or hooked.app is not self.app:
            hooked = _TrustHook(self.app, self.guard)
            _TRUST_HOOKS[config] = hooked  # one wrapper per server, not per connection
        self.app = hooked
        self._ip: str | None = None  # set once admitted
        self._phase: str | None = None
        self._deadline: asyncio.TimerHandle | None = None

    # ---- admission -----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        ip = peer_key(transport.get_extra_info("peername"))
        if not self.guard.admit(ip):
            transport.write(REFUSED_RESPONSE)
            transport.close()
            return
        self._ip = ip
        super().connection_made(transport)
        self._track()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._ip is None:  # refused: uvicorn never saw it
            return
        self._set_deadline(None)
        self.guard.release(self._ip)
        self._ip = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._ip is None:
            return
        super().data_received(data)
        self._track()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._track()

    # ---- deadlines -----------------------------------------------------------------------------
    def _track(self) -> None:
        """Arm the deadline of the phase the client is in (only when the phase changes)."""
        if self.transport is None or self.transport.is_closing():
            self._set_deadline(None)
            return
        state = self.conn.their_state
        phase = "head" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None
        if phase != self._phase:
            self._set_deadline(phase)

    def _set_deadline(self, phase: str | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._phase = phase
        if phase is not None:
            limits = self.guard.limits
            timeout = limits.header_timeout_s if phase == "head" else limits.body_timeout_s
            self._deadline = self.loop.call_later(timeout, self._expired, phase)

    def _expired(self, phase: str) -> None:
        self._deadline = None
        if self.transport is None or self.transport.is_closing() or self._phase != phase:
            return
        self.guard.timed_out(phase)
        self.transport.close()  # connection_lost tells a running request cycle (http.disconnect)


def server_config(app: Any, limits: ConnLimits, *, host: str = "127.0.0.1", port: int = 0,
                  guard: ConnectionGuard | None = None, name: str = "orchestrator", **kw: Any) -> uvicorn.Config:
    """A uvicorn Config serving ``app`` behind a ConnectionGuard (one process). Raises RLIMIT_NOFILE first.

    uvicorn's ``limit_concurrency`` stays off: it counts idle connections too, so held-open ones would turn honest
    requests into 503s; the guard's caps bound connections and each carries at most one request at a time."""
    raise_nofile_limit()
    config = uvicorn.Config(app, host=host, port=port, http=GuardedH11Protocol, backlog=limits.backlog,
                            timeout_keep_alive=limits.idle_timeout_s, limit_concurrency=None, **kw)  # type: ignore[arg-type]
    config.connection_guard = guard or ConnectionGuard(limits, name=name)
    return config


class ClosingServer(uvicorn.Server):
    """uvicorn's server that calls ``on_close`` when its shutdown begins, before it waits for the requests in
    flight: the app wakes its long polls there, so a stop takes milliseconds instead of a long poll's wait."""

    def __init__(self, config: uvicorn.Config, on_close: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self.on_close = on_close

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.on_close is not None:
            self.on_close()
        await super().shutdown(sockets)


def run(app: Any, limits: ConnLimits, *, host: str, port: int, workers: int = 1, log_level: str = "info",
        factory: bool = False, on_close: Callable[[], None] | None = None) -> None:
    """Serve until interrupted. ``workers > 1`` needs ``app`` as an import string; each worker process builds
    its own guard from LIMITS_ENV (so per-address caps apply per worker). ``on_close`` (one process only): see
    ``ClosingServer``."""
    if workers > 1:
        raise_nofile_limit()
        os.environ[LIMITS_ENV] = json.dumps(dataclasses.asdict(limits))
        uvicorn.run(app, factory=factory, host=host, port=port, workers=workers, log_level=log_level, access_log=False,
                    http=_HTTP_CLASS, backlog=limits.backlog, timeout_keep_alive=limits.idle_timeout_s)
        return
    # no access log: a line per request is ~6% of a heartbeat's cost at 1000/s; the orchestrator logs its events
    ClosingServer(server_config(app, limits, host=host, port=port, log_level=log_level, factory=factory,
                                access_log=False), on_close).run()
