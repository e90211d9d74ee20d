"""A small HTTP/1.1 GET client for shard bodies: the socket reads straight into reusable buffers
(``asyncio.BufferedProtocol``), and each filled buffer (or what arrived within ``FLUSH_S``) goes to a callback (write to disk + hash) from the
event loop's read callback itself, with no per-chunk objects, tasks or copies in between. The callback may lend the
buffer to a thread (it returns a ``concurrent.futures.Future``): the socket then reads into the connection's other
buffer meanwhile, reading pauses while every buffer is lent, and a request ends only once its buffers are back.

Used only for shard bodies (``download._fetch_one_shard``); everything else (discovery, manifests) goes
through aiohttp. Responses are untrusted: the status line and headers are bounded (``MAX_HEAD``,
``MAX_HEADERS``), chunked bodies are refused, a body may not run past the bytes the caller expects, and
the caller's progress deadline bounds time. Connections are kept alive per server (``RawPool``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["RawPool", "RawResponse", "HTTPStatus", "BadResponse", "MAX_HEAD", "BUFFER"]

MAX_HEAD = 64 * 1024
MAX_HEADERS = 100
BUFFER = 4 << 20  # a body's buffer (a shorter body gets one its size): fewer, larger hand-offs to the callback
BUFFERS = 2  # per request: one filling from the socket while the other is lent (DataCallback)
HEAD_BUFFER = 16384
SPARE = 4  # idle BUFFER-sized body buffers the process keeps for the next bodies (16 MiB at most)
_spare: list[memoryview] = []


def _take(size: int) -> memoryview:
    """A body buffer of ``size`` bytes: a spare one when there is one (a fresh 4 MiB costs ~1 ms of page faults
    and zeroing, on the event loop)."""
    if size == BUFFER:
        try:
            return _spare.pop()
        except IndexError:  # (none, or another thread's loop took the last one)
            pass
    return memoryview(bytearray(size))


def _give(view: memoryview) -> None:
    if len(view) == BUFFER and len(_spare) < SPARE:
        _spare.append(view)
FLUSH_S = 0.05  # a slow body is handed on at least this often (progress deadlines, relays streaming onward)


class BadResponse(OSError):
    """A malformed or over-long response (the connection is dropped)."""


class HTTPStatus(OSError):
    """A response with a status other than 200/206 (``status``)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status} {reason}")
        self.status = status


@dataclass
class RawResponse:
    status: int
    reason: str
    headers: dict[str, str]
    length: int | None  # Content-Length (None: until the connection closes)


# on_head(response) -> max body bytes accepted; on_data(memoryview) consumes a filled buffer before it returns
# (None), or lends it until the returned future is done (the work on it runs on another thread meanwhile)
HeadCallback = Callable[[RawResponse], int]
DataCallback = Callable[[memoryview], "concurrent.futures.Future[object] | None"]


class _Conn(asyncio.BufferedProtocol):
    def __init__(self) -> None:
        self.head_view = memoryview(bytearray(HEAD_BUFFER))
        self.views: list[memoryview] = []  # the body's buffers: made when its headers arrive, dropped after it
        self.cur = 0
        self.view = self.head_view
        self.lent: set[int] = set()  # buffers a DataCallback holds (their futures not done yet)
        self._paused = False  # reading paused until a lent buffer comes back
        self._settled: list[asyncio.Future[None]] = []  # woken when nothing is lent
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.got_any = False
        self._flush_timer: asyncio.TimerHandle | None = None
        self._reset()

    def _reset(self) -> None:
        self.head = bytearray()
        self.in_head = True
        self.filled = 0
        self.flushed_at = time.monotonic()
        self.left: int | None = None  # body bytes still expected (None: until EOF)
        self.resp: RawResponse | None = None
        self.done: asyncio.Future[RawResponse] | None = None
        self.on_head: HeadCallback | None = None
        self.on_data: DataCallback | None = None
        self.keep_alive = True
        self._complete = False  # the body is all here: done once no buffer is lent

    # ---- protocol callbacks -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.in_head:
            return self.head_view
        room = len(self.view) - self.filled
        if self.left is not None:
            room = min(room, max(self.left - self.filled, 1))
        return self.view[self.filled:self.filled + room]

    def buffer_updated(self, nbytes: int) -> None:
        if self.done is None or self.done.done() or self._complete:
            self._drop()  # bytes nobody asked for
            return
        self.got_any = True
        try:
            if self.in_head:
                self._head_bytes(bytes(self.head_view[:nbytes]))
            else:
                self.filled += nbytes
                self._maybe_flush(final=False)
        except BaseException as e:  # noqa: BLE001  # handed to the waiting request
            self._fail(e)

    def eof_received(self) -> bool:
        self.keep_alive = False
        if self.done is not None and not self.done.done() and not self._complete:
            try:
                if self.in_head:
                    raise BadResponse("connection closed before the response headers")
                self._maybe_flush(final=True)
                if self.left is None:
                    self._finish()
                elif not self.done.done():
                    raise BadResponse(f"connection closed {self.left - self.filled} bytes before the body's end")
            except BaseException as e:  # noqa: BLE001
                self._fail(e)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.done is not None and not self.done.done() and not self._complete:  # (complete: lent buffers
            self.done.set_exception(exc or BadResponse("connection lost"))  # finish the request)

    # ---- parsing ------------------------------------------------------------------------------
    def _head_bytes(self, data: bytes) -> None:
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > MAX_HEAD:
                raise BadResponse(f"response headers over {MAX_HEAD} bytes")
            return
        if end > MAX_HEAD:
            raise BadResponse(f"response headers over {MAX_HEAD} bytes")
        rest = bytes(self.head[end + 4:])
        lines = bytes(self.head[:end]).decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit() or len(parts[1]) != 3:
            raise BadResponse(f"bad status line {lines[0][:80]!r}")
        if len(lines) - 1 > MAX_HEADERS:
            raise BadResponse(f"more than {MAX_HEADERS} response headers")
        headers: dict[str, str] = {}
        for ln in lines[1:]:
            k, sep, v = ln.partition(":")
            if not sep or not k or k != k.strip():
                raise BadResponse(f"bad header line {ln[:80]!r}")
            k = k.lower()
            v = v.strip()
            if k in headers and k in ("content-length", "content-range", "transfer-encoding"):
                raise BadResponse(f"repeated {k} header")
            headers[k] = v
        status = int(parts[1])
        conn = headers.get("connection", "").lower()
        if parts[0] == "HTTP/1.0" and "keep-alive" not in conn or "close" in conn:
            self.keep_alive = False
        if "transfer-encoding" in headers:
            raise BadResponse(f"transfer-encoding {headers['transfer-encoding'][:40]!r} not supported for shards")
        length: int | None = None
        if "content-length" in headers:
            cl = headers["content-length"]
            if not cl.isdigit() or len(cl) > 15:
                raise BadResponse(f"bad content-length {cl[:40]!r}")
            length = int(cl)
        resp = self.resp = RawResponse(status, parts[2][:80] if len(parts) > 2 else "", headers, length)
        assert self.on_head is not None
        limit = self.on_head(resp)  # raises for a status or a length the caller does not accept
        if length is None:
            self.keep_alive = False
            self.left = None
            self._limit = limit
        else:
            if length > limit:
                raise BadResponse(f"body of {length} bytes, expected at most {limit}")
            self.left = length
        self._limit = limit
        self.in_head = False
        self.head = bytearray()
        self._body_buffers(BUFFER if self.left is None else min(BUFFER, max(self.left, 1)))
        if rest:
            n = len(rest)
            if self.left is not None and n > self.left:
                raise BadResponse("bytes beyond the response body")
            self.view[:n] = rest
            self.filled = n
        self._maybe_flush(final=False)

    def _maybe_flush(self, final: bool) -> None:
        expected_end = self.left is not None and self.filled >= self.left
        now = time.monotonic()
        if self.filled and (self.filled >= len(self.view) or expected_end or final or now - self.flushed_at >= FLUSH_S):
            self.flushed_at = now
            n = self.filled
            if self.left is None:
                self._limit -= n
                if self._limit < 0:
                    raise BadResponse("body longer than expected")
            else:
                self.left -= n
            self.filled = 0
            assert self.on_data is not None
            lent = self.on_data(self.view[:n])
            if lent is not None:
                self._lend(lent)
        elif self.filled and self._flush_timer is None and self.transport is not None:
            # bytes held and none arriving: hand them on within FLUSH_S anyway (a stalling server's last bytes
            # count as progress, a relay streams a slow body onward)
            self._flush_timer = asyncio.get_running_loop().call_later(FLUSH_S, self._timed_flush)
        if self.left == 0:
            self._finish()

    def _timed_flush(self) -> None:
        self._flush_timer = None
        if self.done is None or self.done.done() or self.in_head:
            return
        try:
            self._maybe_flush(final=False)
        except BaseException as e:  # noqa: BLE001  # handed to the waiting request
            self._fail(e)

    def _finish(self) -> None:
        self._complete = True
        if self.done is not None and not self.done.done() and not self.lent:
            assert self.resp is not None
            self.done.set_result(self.resp)

    # ---- body buffers, lent ---------------------------------------------------------------------
    def _body_buffers(self, size: int) -> None:
        """One buffer of ``size`` bytes for the body now (a second is made if the first is lent)."""
        self.release_buffers()
        self.views = [_take(size)]
        self.cur = 0
        self.view = self.views[0]

    def release_buffers(self) -> None:
        """Hand the body buffers of an idle connection back (nothing lent)."""
        if not self.lent:
            for v in self.views:
                _give(v)
            self.views = []
            self.view = self.head_view

    def _lend(self, fut: concurrent.futures.Future[object]) -> None:
        """The current buffer is held until ``fut`` is done; read into a free one meanwhile (a second buffer is
        made on the first lend), or pause reading until one comes back."""
        idx = self.cur
        self.lent.add(idx)
        loop = asyncio.get_running_loop()
        fut.add_done_callback(lambda f: loop.call_soon_threadsafe(self._returned, idx, f))
        if len(self.views) < BUFFERS:
            self.views.append(_take(len(self.views[0])))
        free = [i for i in range(len(self.views)) if i not in self.lent]
        if free:
            self.cur = free[0]
            self.view = self.views[self.cur]
        elif self.transport is not None and not self._paused and not self.transport.is_closing():
            self._paused = True
            self.transport.pause_reading()

    def _returned(self, idx: int, fut: concurrent.futures.Future[object]) -> None:
        self.lent.discard(idx)
        if self._paused:
            self._paused = False
            self.cur = idx
            self.view = self.views[idx]
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()
        exc = None if fut.cancelled() else fut.exception()
        if exc is not None:
            self._fail(exc)
        elif self._complete:
            self._finish()
        if not self.lent:
            for w in self._settled:
                if not w.done():
                    w.set_result(None)
            self._settled.clear()

    async def settled(self) -> None:
        """Return once no buffer is lent (the threads holding them are done with them)."""
        if self.lent:
            w = asyncio.get_running_loop().create_future()
            self._settled.append(w)
            await w

    def _fail(self, e: BaseException) -> None:
        self.keep_alive = False
        if self.done is not None and not self.done.done():
            self.done.set_exception(e)
        self._drop()

    def _drop(self) -> None:
        self.keep_alive = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    # ---- one request --------------------------------------------------------------------------
    def request(self, raw: bytes, on_head: HeadCallback, on_data: DataCallback) -> asyncio.Future[RawResponse]:
        self._reset()
        self.on_head, self.on_data = on_head, on_data
        self.done = asyncio.get_running_loop().create_future()
        self.got_any = False
        assert self.transport is not None
        self.transport.write(raw)
        return self.done


class RawPool:
    """Kept-alive connections per (host, port); ``get`` sends one GET and streams its body to ``on_data``."""

    def __init__(self, idle_per_host: int = 16) -> None:
        self.idle: dict[tuple[str, int], list[_Conn]] = {}
        self.idle_per_host = idle_per_host

    async def get(self, url: str, headers: dict[str, str], on_head: HeadCallback, on_data: DataCallback
                  ) -> RawResponse:
        """GET ``url``; ``on_head`` sees the status and headers and returns the most body bytes it accepts
        (or raises); ``on_data`` gets each filled buffer, valid only during the call. Cancelling drops the
        connection."""
        u = urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise BadResponse(f"only http:// URLs are fetched this way, not {url[:80]!r}")
        host, port = u.hostname, u.port or 80
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        hosthdr = f"[{host}]" if ":" in host else host
        lines = [f"GET {path} HTTP/1.1", f"Host: {hosthdr}:{port}", "Accept-Encoding: identity",
                 "User-Agent: swarmrl-shardcast"] + [f"{k}: {v}" for k, v in headers.items()]
        raw = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        key = (host, port)
        while True:
            conn, reused = None, False
            idle = self.idle.get(key, [])
            while idle:
                c = idle.pop()
                if not c.closed and c.transport is not None and not c.transport.is_closing():
                    conn, reused = c, True
                    break
            if conn is None:
                _, conn = await asyncio.get_running_loop().create_connection(_Conn, host, port)
            ok = False
            try:
                resp = await conn.request(raw, on_head, on_data)
                ok = True
                return resp
            except OSError:
                if reused and not conn.got_any:
                    continue  # the server closed the idle kept-alive connection: once more on a new one
                raise
            finally:
                if conn.lent:  # failed or cancelled with buffers still lent: their work ends before the caller
                    conn._drop()  # goes on (it may reset what that work writes to)
                    await asyncio.shield(conn.settled())
                conn.release_buffers()
                if ok and conn.keep_alive and not conn.closed \
                        and len(self.idle.setdefault(key, [])) < self.idle_per_host:
                    self.idle[key].append(conn)
                else:
                    conn._drop()

    def close(self) -> None:
        for conns in self.idle.values():
            for c in conns:
                c._drop()
        self.idle.clear()

    async def get_small(self, url: str, limit: int, timeout: float) -> tuple[int, bytes]:
        """(status, body) of a GET whose body is at most ``limit`` bytes (a longer one is refused: BadResponse),
        all within ``timeout`` seconds (TimeoutError)."""
        body = bytearray()

        def on_head(r: RawResponse) -> int:
            if r.length is not None and r.length > limit:
                raise BadResponse(f"response of {r.length} bytes exceeds limit {limit}")
            return limit

        def on_data(view: memoryview) -> None:
            body.extend(view)

        async with asyncio.timeout(timeout):
            r = await self.get(url, {}, on_head, on_data)
        return r.status, bytes(body)

    async def __aenter__(self) -> RawPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    async def aclose(self) -> None:
        self.close()
