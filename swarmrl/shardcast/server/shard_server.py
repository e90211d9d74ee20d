"""The aiohttp app every SHARDCAST node (origin or relay) serves its directory with.

Only these paths exist (anything else is 404, other methods 405, bodies refused):

    GET/HEAD /distribution.txt         public manifest (empty if no version yet)
    GET/HEAD /data1.bin                probe file for old clients
    GET/HEAD /v<N>/shard_<IIIII>.bin   a shard, via FileResponse (sendfile, Range, keep-alive)
    GET/HEAD /v<N>/manifest.json       the signed per-version manifest
    GET      /versions.json[?since=SEQ&wait=S]   live state, long-poll until seq > SEQ
    GET/HEAD /metrics                  Prometheus metrics (``metrics``; rendered at most once a second)

Pipelining: a relay announces a version as *partial* as soon as it holds the verified signed
manifest; a request for a shard of a partial version that has not landed yet is held open
(up to ``hold_s``) and answered the moment the shard is verified and renamed into place.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from swarmrl.shardcast.config import SHARDCAST_LIMITS
from swarmrl.shardcast.layout import (
    DISTRIBUTION_NAME,
    MANIFEST_NAME,
    PROBE_NAME,
    LayoutError,
    atomic_write,
    parse_distribution,
    shard_name,
)
from swarmrl.shardcast.server import guard
from swarmrl.shardcast.server.metrics import ServerMetrics
from swarmrl.shardcast.server.streaming import Growing, Pacer
from swarmrl.utils.serving import ConnectionGuard, ConnLimits, raise_nofile_limit

__all__ = ["ShardServer", "BackgroundLoop", "ensure_probe_file"]

T = TypeVar("T")
_SLASHES = re.compile(r"/{2,}")
_PATH = web.RequestKey("shardcast_path", str)  # the request path, runs of slashes made one
_SHARD_RE = re.compile(r"/v(0|[1-9]\d{0,12})/shard_(\d{5})\.bin")
_MANIFEST_RE = re.compile(r"/v(0|[1-9]\d{0,12})/manifest\.json")
MAX_HOLD_S = 60.0
MAX_LINE = 4096
MAX_FIELD = 4096
MAX_HEADERS = 64


def ensure_probe_file(root: Path, size: int = 64 * 1024) -> None:
    p = root / PROBE_NAME
    if not p.exists():
        atomic_write(p, os.urandom(size), fsync=False)


@dataclass(frozen=True)
class Serving:
    """How a server that is not its own origin serves (a relay's ``ShardServer`` settings): long polls held at most
    ``hold_s``; ``rate_limit_bps`` / ``max_upload_mbps``, upload caps per response / over all responses (None: none);
    ``limits``, its connection caps and read deadlines (None: ``config.SHARDCAST_LIMITS``)."""

    hold_s: float = 20.0
    rate_limit_bps: float | None = None
    limits: ConnLimits | None = None
    max_upload_mbps: float | None = None


@dataclass
class _Partial:
    num_shards: int
    have: set[int] = field(default_factory=set)


class ShardServer:
    """Serves ``root``; call ``notify()`` (same loop) or ``notify_threadsafe()`` after changes.

    A watcher also re-reads distribution.txt when its stat changes, so a directory written by
    another process (``swarmrl shardcast publish``) is picked up within ``watch_s``.

    Connections are capped per address and in all, with read deadlines (``limits``, default
    ``config.SHARDCAST_LIMITS``; see ``swarmrl.shardcast.server.guard``).
    """

    def __init__(self, root: str | Path, *, hold_s: float = 20.0, watch_s: float = 0.2,
                 rate_limit_bps: float | None = None, max_holds: int = 4096,
                 limits: ConnLimits | None = None, max_upload_mbps: float | None = None) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.hold_s = min(hold_s, MAX_HOLD_S)
        self.watch_s = watch_s
        self.rate_limit_bps = rate_limit_bps  # per connection: testing / simulation of slow links only
        # the server's upload cap (all shard bytes it sends, together), in megabits per second
        self.pacer = Pacer(max_upload_mbps * 1e6 / 8) if max_upload_mbps else None
        self.growing: dict[tuple[int, int], Growing] = {}
        self.seq = 0
        self.complete: list[int] = []
        self.partial: dict[int, _Partial] = {}
        self._dist_stat: tuple[int, int, int] | None = None
        self._changed: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self.port: int | None = None
        self.host = "127.0.0.1"
        self.requests = 0
        self.max_holds = max_holds
        self._holds = 0
        self.bytes_requested = 0
        self.limits = limits or SHARDCAST_LIMITS
        self.guard: ConnectionGuard | None = None
        self._listener: asyncio.AbstractServer | None = None
        self.metrics = ServerMetrics(lambda: (len(self.complete), len(self.partial), max(self.complete, default=0)))
        ensure_probe_file(self.root)
        self._reload_distribution()

    # ---- state ---------------------------------------------------------------------------------
    def _reload_distribution(self) -> bool:
        p = self.root / DISTRIBUTION_NAME
        try:
            st = p.stat()
            key = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            key = None
        if key == self._dist_stat:
            return False
        self._dist_stat = key
        try:
            entries = parse_distribution(p.read_bytes()) if key else []
        except (OSError, LayoutError):
            entries = []
        self.complete = [e.version for e in entries]
        for v in self.complete:
            self.partial.pop(v, None)
        return True

    def set_partial(self, version: int, num_shards: int, have: set[int] | None = None) -> None:
        self.partial[version] = _Partial(num_shards, set(have or ()))
        self.notify()

    def shard_landed(self, version: int, index: int) -> None:
        p = self.partial.get(version)
        if p is not None:
            p.have.add(index)
        g = self.growing.pop((version, index), None)
        if g is not None:
            g.final, g.have = True, g.size
            g.wake()
        self.notify()

    def shard_progress(self, version: int, index: int, part: Path, size: int, have: int) -> None:
        """A relay holds ``have`` contiguous (unverified) bytes of a shard in ``part``: stream them onward."""
        g = self.growing.get((version, index))
        if g is None:
            g = self.growing[(version, index)] = Growing(part, size)
            g.have = have
            self.notify()  # wakes requests held for this shard
        else:
            g.have = have
        g.wake()

    def shard_reset(self, version: int, index: int) -> None:
        """The relay threw away what it had of a shard: cut off the responses streaming it."""
        g = self.growing.pop((version, index), None)
        if g is not None:
            g.gen += 1
            g.wake()

    def drop_partial(self, version: int) -> None:
        self.partial.pop(version, None)
        for key in [k for k in self.growing if k[0] == version]:
            self.shard_reset(*key)
        self.notify()

    def refresh(self) -> None:
        """Re-read distribution.txt now (same loop) and wake waiters."""
        self._dist_stat = None
        self._reload_distribution()
        self.notify()

    def notify(self) -> None:
        self.seq += 1
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)
        self._changed = None

    def notify_threadsafe(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.refresh)

    async def _wait_change(self, timeout: float) -> None:
        if self._changed is None or self._changed.done():
            self._changed = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self._changed), timeout)
        except TimeoutError:
            pass

    def snapshot(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "complete": list(self.complete),
            "partial": {str(v): {"num_shards": p.num_shards, "have": len(p.have)}
                        for v, p in sorted(self.partial.items())},
        }

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.watch_s)
            if self._reload_distribution():
                self.notify()

    # ---- HTTP -----------------------------------------------------------------------------------
    @web.middleware
    async def _guard(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                     ) -> web.StreamResponse:
        guard.request_started(request)
        raw = request.raw_path.split("?", 1)[0]
        if ".." in raw or "%" in raw or "\\" in raw or "\x00" in raw or not raw.startswith("/"):
            return web.Response(status=400, text="bad path\n")
        # a client joining "http://host/" and "/v1/..." asks for "//v1/...": runs of slashes count as one
        request[_PATH] = _SLASHES.sub("/", raw)
        if request.method not in ("GET", "HEAD"):
            return web.Response(status=405, text="method not allowed\n", headers={"Allow": "GET, HEAD"})
        if request.content_length:
            return web.Response(status=413, text="request bodies are not accepted\n")
        self.requests += 1
        resp = await handler(request)
        if resp.status < 400:
            guard.trust(request)
        return resp

    def _inside(self, path: Path) -> bool:
        try:
            return path.resolve().is_relative_to(self.root)
        except OSError:
            return False

    async def _file(self, request: web.Request, path: Path, paced: bool = False) -> web.StreamResponse:
        if not self._inside(path) or not path.is_file():
            raise web.HTTPNotFound()
        if self.rate_limit_bps or (paced and self.pacer is not None):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                raise web.HTTPNotFound() from None
            try:
                return await self._send(request, fd, os.fstat(fd).st_size, None, paced)
            finally:
                os.close(fd)
        resp = web.FileResponse(path, chunk_size=1 << 20)
        resp.headers["Cache-Control"] = "no-cache"
        return resp

    @staticmethod
    def _range(request: web.Request, size: int) -> tuple[int, int]:
        try:
            rng = request.http_range
        except ValueError:
            raise web.HTTPRequestRangeNotSatisfiable() from None
        start = rng.start or 0
        stop = size if rng.stop is None else min(rng.stop, size)
        if start < 0:
            start, stop = max(size + start, 0), size
        if (start >= size and size) or stop < start:
            raise web.HTTPRequestRangeNotSatisfiable()
        return start, stop

    async def _send(self, request: web.Request, fd: int, size: int, growing: Growing | None,
                    paced: bool) -> web.StreamResponse:
        """Send [range of] the ``size`` bytes of ``fd`` by chunks: under the upload cap (``paced``) or a test rate,
        and, for a shard still arriving (``growing``), as its bytes land."""
        start, stop = self._range(request, size)
        resp = web.StreamResponse(status=206 if (start or stop != size) else 200)
        resp.content_length = stop - start
        resp.headers["Cache-Control"] = "no-cache"
        if resp.status == 206:
            resp.headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
        await resp.prepare(request)
        if request.method == "HEAD":
            return resp
        conn_pacer = Pacer(self.rate_limit_bps) if self.rate_limit_bps else None
        pacer = self.pacer if paced else None
        chunk = 16384 if conn_pacer else (256 << 10 if pacer else 1 << 20)
        gen = growing.gen if growing is not None else 0
        pos = start
        while pos < stop:
            avail = stop
            if growing is not None:
                if growing.gen != gen:
                    return self._cut(request, resp)
                avail = min(stop, growing.size if growing.final else growing.have)
                if avail <= pos:
                    if not await growing.wait(self.hold_s) and growing.have <= pos and not growing.final:
                        return self._cut(request, resp)
                    continue
            n = min(chunk, avail - pos)
            for p in (conn_pacer, pacer):
                if p is not None:
                    await p.take(n)
            data = os.pread(fd, n, pos)
            if not data:
                return self._cut(request, resp)
            await resp.write(data)
            pos += len(data)
        await resp.write_eof()
        return resp

    @staticmethod
    def _cut(request: web.Request, resp: web.StreamResponse) -> web.StreamResponse:
        """End a response mid-body (the reader sees a short body and resumes or re-fetches elsewhere)."""
        if request.transport is not None:
            request.transport.close()
        return resp

    async def _distribution(self, request: web.Request) -> web.StreamResponse:
        p = self.root / DISTRIBUTION_NAME
        if not p.is_file():
            return web.Response(text="", content_type="text/plain")
        return await self._file(request, p)

    async def _probe(self, request: web.Request) -> web.StreamResponse:
        return await self._file(request, self.root / PROBE_NAME, paced=True)

    async def _versions(self, request: web.Request) -> web.StreamResponse:
        try:
            since = int(request.query.get("since", "-1"))
            wait = min(float(request.query.get("wait", "0")), MAX_HOLD_S)
        except ValueError:
            raise web.HTTPBadRequest(text="since/wait must be numbers\n") from None
        if not math.isfinite(wait):
            raise web.HTTPBadRequest(text="wait must be finite\n")
        deadline = time.monotonic() + max(wait, 0.0)
        while self.seq <= since:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await self._wait_change(left)
        return web.json_response(self.snapshot(), headers={"Cache-Control": "no-cache"})

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.get(_PATH, request.path)
        if path == "/" + DISTRIBUTION_NAME:
            return await self._distribution(request)
        if path == "/" + PROBE_NAME:
            return await self._probe(request)
        if path == "/versions.json":
            return await self._versions(request)
        if path == "/metrics":
            return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})
        m = _SHARD_RE.fullmatch(path)
        if m:
            return await self._shard(request, int(m.group(1)), int(m.group(2)))
        m = _MANIFEST_RE.fullmatch(path)
        if m:
            return await self._file(request, self.root / f"v{int(m.group(1))}" / MANIFEST_NAME)
        raise web.HTTPNotFound()

    async def _shard(self, request: web.Request, version: int, index: int) -> web.StreamResponse:
        if index < 1:
            raise web.HTTPNotFound()
        path = self.root / f"v{version}" / shard_name(index)
        if path.is_file():
            return await self._file(request, path, paced=True)
        part = self.partial.get(version)
        if part is None or index > part.num_shards:
            raise web.HTTPNotFound()
        if self._holds >= self.max_holds:  # bounded: held requests cost a socket each
            raise web.HTTPServiceUnavailable(text="too many waiting requests\n", headers={"Retry-After": "1"})
        self._holds += 1
        try:
            deadline = time.monotonic() + self.hold_s
            while True:
                if path.is_file():
                    break
                g = self.growing.get((version, index))
                if g is not None:
                    try:
                        fd = os.open(g.path, os.O_RDONLY)
                    except FileNotFoundError:  # landed (renamed) or reset meanwhile: look again
                        await self._wait_change(0.05)
                        continue
                    try:
                        return await self._send(request, fd, g.size, g, paced=True)
                    finally:
                        os.close(fd)
                part = self.partial.get(version)
                if part is None or index > part.num_shards:
                    raise web.HTTPNotFound()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise web.HTTPServiceUnavailable(text="shard not here yet\n", headers={"Retry-After": "1"})
                await self._wait_change(min(left, 1.0))
        finally:
            self._holds -= 1
        return await self._file(request, path, paced=True)

    async def _count_response(self, request: web.Request, resp: web.StreamResponse) -> None:
        self.metrics.response(request.method, resp.status, resp.content_length)

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=1024)
        app.on_response_prepare.append(self._count_response)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._loop = asyncio.get_running_loop()
        raise_nofile_limit()
        self.guard = ConnectionGuard(self.limits, name=f"shardcast {self.root.name}")
        self._runner = web.AppRunner(self.make_app(), access_log=None, handler_cancellation=True,
                                     max_line_size=MAX_LINE, max_field_size=MAX_FIELD,
                                     max_headers=MAX_HEADERS, shutdown_timeout=0.5,
                                     keepalive_timeout=self.limits.idle_timeout_s)
        await self._runner.setup()
        self._listener = await guard.listen(self._runner, self.guard, host, port)
        self.port = self._listener.sockets[0].getsockname()[1]
        self.host = host if host not in ("", "0.0.0.0", "::") else "127.0.0.1"  # noqa: S104  # an address to reach it
        self._watch_task = asyncio.create_task(self._watch())
        return self.port

    async def stop(self) -> None:
        if self._watch_task:
            self._watch_task.cancel()
        self.notify()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._runner:
            await self._runner.cleanup()
        self._runner = None

    @property
    def url(self) -> str:
        return f"http://[{self.host}]:{self.port}" if ":" in self.host else f"http://{self.host}:{self.port}"


class BackgroundLoop:
    """An asyncio loop on a daemon thread, for running servers next to synchronous code."""

    def __init__(self, name: str = "shardcast-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()
