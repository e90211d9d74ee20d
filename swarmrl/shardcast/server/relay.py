"""A relay: mirrors signed versions from one or more upstreams (origin or relays) and serves them.

* Learns of new versions within milliseconds: it long-polls each upstream's ``/versions.json``
  (a static upstream's ``distribution.txt`` is polled every ``poll_s`` instead).
* Verifies the origin's signature on each manifest before announcing the version, and each
  shard's BLAKE3 before renaming it into place; only verified bytes are ever served.
* Pipelines: the version is announced as *partial* as soon as the manifest is verified; each
  shard is served downstream the moment it lands, while later shards are still arriving.
* Survives restarts: verified shards stay, interrupted ``.part`` files resume with Range, a
  version enters ``distribution.txt`` (atomically rewritten) only once every shard is there.
* Keeps the last ``keep`` versions, and version 0 (the run's base model) for good.
* Fetches from its upstreams with the client's options (``upstream_options``: ``FetchOptions``, by default
  ``RELAY_UPSTREAM``: four shards in flight, four tries per shard in a round; the relay retries the round), and
  follows them as ``watch`` says (``UpstreamWatch``); serves as ``serving`` says (``shard_server.Serving``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3

from swarmrl.shardcast.client.fetch import (
    FetchError,
    ServerPool,
    download_shards,
    get_manifest_raw,
    new_session,
    server_versions,
)
from swarmrl.shardcast.client.http_get import RawPool
from swarmrl.shardcast.client.options import RELAY_UPSTREAM, FetchOptions
from swarmrl.shardcast.layout import (
    BASE_VERSION,
    DISTRIBUTION_NAME,
    MANIFEST_NAME,
    LayoutError,
    Manifest,
    atomic_write,
    format_distribution,
    parse_distribution,
    retain,
    shard_name,
)
from swarmrl.shardcast.server.metrics import RelayMetrics
from swarmrl.shardcast.server.shard_server import Serving, ShardServer
from swarmrl.shardcast.signing import load_public_key, verify_manifest
from swarmrl.shardcast.urls import normalize_url
from swarmrl.utils.metrics import MetricsWriter

__all__ = ["Relay"]

log = logging.getLogger("swarmrl.shardcast.server.relay")


class _RelaySink:
    """Per-shard ``.part`` files, renamed to ``shard_XXXXX.bin`` once verified."""

    def __init__(self, vdir: Path, m: Manifest, server: ShardServer, metrics: RelayMetrics) -> None:
        self.vdir, self.m, self.server, self.metrics = vdir, m, server, metrics
        self.fds: dict[int, int] = {}

    def _part(self, index: int) -> Path:
        return self.vdir / f".{shard_name(index)}.part"

    def _fd(self, index: int) -> int:
        fd = self.fds.get(index)
        if fd is None:
            fd = self.fds[index] = os.open(self._part(index), os.O_RDWR | os.O_CREAT, 0o644)
        return fd

    def resume_from(self, index: int) -> tuple[int, Any]:
        h = blake3.blake3()
        p = self._part(index)
        if not p.exists():
            return 0, h
        size = p.stat().st_size
        if size > self.m.shards[index - 1].size:
            os.truncate(p, 0)
            return 0, h
        with p.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        return size, h

    def write(self, index: int, pos: int, data: bytes | memoryview) -> None:
        fd = self._fd(index)
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, pos)
            view, pos = view[n:], pos + n
        # served onward as it arrives (readers verify the shard's signed hash; a reset cuts them off)
        self.server.shard_progress(self.m.version, index, self._part(index), self.m.shards[index - 1].size, pos)

    def reset(self, index: int) -> None:
        self.server.shard_reset(self.m.version, index)
        os.ftruncate(self._fd(index), 0)

    def done(self, index: int) -> None:
        fd = self._fd(index)
        os.ftruncate(fd, self.m.shards[index - 1].size)
        os.close(self.fds.pop(index))
        os.replace(self._part(index), self.vdir / shard_name(index))
        self.metrics.shards_verified.inc()
        self.server.shard_landed(self.m.version, index)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


@dataclass(frozen=True)
class UpstreamWatch:
    """How a relay follows its upstreams: a long poll of ``/versions.json`` waits up to ``longpoll_s`` (a static
    upstream's ``distribution.txt`` is polled every ``poll_s``, also the back-off after an error), and an upstream
    that fails is left out for ``exclude_s``."""

    poll_s: float = 1.0
    longpoll_s: float = 20.0
    exclude_s: float = 10.0


class Relay:
    def __init__(self, root: str | Path, upstreams: Iterable[str], origin_pubkey: Any, *, keep: int = 5,
                 upstream_options: FetchOptions = RELAY_UPSTREAM, watch: UpstreamWatch = UpstreamWatch(),
                 serving: Serving = Serving(), metrics: str | Path | None = None) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.upstreams = list(dict.fromkeys(normalize_url(u) for u in upstreams))
        if not self.upstreams:
            raise ValueError("a relay needs at least one upstream")
        self.pub = load_public_key(origin_pubkey)
        self.keep = keep
        self.upstream_options = upstream_options
        self.poll_s = watch.poll_s
        self.longpoll_s = watch.longpoll_s
        self.server = ShardServer(self.root, hold_s=serving.hold_s, rate_limit_bps=serving.rate_limit_bps,
                                  limits=serving.limits, max_upload_mbps=serving.max_upload_mbps)
        self.pool = ServerPool(self.upstreams, max_failures=upstream_options.max_server_failures,
                               exclude_s=watch.exclude_s)
        self.prom = RelayMetrics(self.server.metrics.registry, lambda: list(self.pool))  # on the server's /metrics
        self._tasks: set[asyncio.Task[Any]] = set()
        self._syncing: dict[int, asyncio.Task[None]] = {}
        self._session: RawPool | None = None
        self.synced: list[int] = []
        self._metrics_path = metrics
        self._metrics: Any = None

    # ---- lifecycle --------------------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        if self._metrics_path is not None and self._metrics is None:
            self._metrics = MetricsWriter(self._metrics_path)
        self._session = new_session()
        for v, n, have in await asyncio.to_thread(self._recover):
            self.server.set_partial(v, n, have)
        await self.server.start(host, port)
        for v in sorted(self.server.partial):
            self._start_sync(v)
        for u in self.upstreams:
            self._spawn(self._watch(u))
        return self.server.url

    async def stop(self) -> None:
        tasks = list(self._tasks) + list(self._syncing.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.server.stop()
        if self._session:
            await self._session.aclose()
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None

    async def run_forever(self, host: str = "127.0.0.1", port: int = 0) -> None:
        await self.start(host, port)
        try:
            await asyncio.Event().wait()
        finally:
            await self.stop()

    @property
    def url(self) -> str:
        return self.server.url

    def _spawn(self, coro: Any) -> None:
        t = asyncio.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    # ---- disk state -------------------------------------------------------------------------------
    def _complete_entries(self) -> list[Any]:
        p = self.root / DISTRIBUTION_NAME
        try:
            return parse_distribution(p.read_bytes()) if p.exists() else []
        except LayoutError:
            return []

    def _recover(self) -> list[tuple[int, int, set[int]]]:
        """After a restart: keep complete versions; re-verify and resume partial ones."""
        out: list[tuple[int, int, set[int]]] = []
        complete = {e.version for e in self._complete_entries()}
        for d in self.root.glob("v*"):
            if not d.is_dir() or not d.name[1:].isdigit():
                continue
            v = int(d.name[1:])
            if v in complete:
                continue
            try:
                m = verify_manifest((d / MANIFEST_NAME).read_bytes(), self.pub, expect_version=v)
            except (OSError, LayoutError):
                shutil.rmtree(d, ignore_errors=True)
                continue
            have = set()
            for i, info in enumerate(m.shards, 1):
                p = d / shard_name(i)
                if p.exists():
                    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
                    h.update_mmap(str(p))
                    if p.stat().st_size == info.size and h.hexdigest() == info.blake3:
                        have.add(i)
                    else:
                        p.unlink()
            out.append((v, m.num_shards, have))
        return out

    # ---- watching upstreams -------------------------------------------------------------------------
    async def _watch(self, url: str) -> None:
        assert self._session is not None
        state = self.pool.servers[url]
        since: int | None = None
        backoff = self.poll_s
        while True:
            try:
                comp, part, seq = await server_versions(self._session, url, since=since,
                                                        wait=self.longpoll_s if since is not None else 0.0)
                state.versions = comp | part
                backoff = self.poll_s
                self._consider(state.versions)
                if seq is None:
                    since = None
                    await asyncio.sleep(self.poll_s)
                else:
                    since = seq
            except asyncio.CancelledError:
                raise
            except (TimeoutError, OSError, LayoutError, ValueError) as e:
                state.last_error = f"watch: {type(e).__name__}: {e}"
                since = None
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    def _consider(self, versions: set[int]) -> None:
        """Mirror the newest ``keep`` versions an upstream offers that we do not hold yet, and version 0 (the base
        model) whenever it is offered."""
        complete = {e.version for e in self._complete_entries()}
        newer = complete - {BASE_VERSION}
        window_full = len(newer) >= self.keep
        offered = sorted(versions - {BASE_VERSION}, reverse=True)[: self.keep]
        for v in offered + ([BASE_VERSION] if BASE_VERSION in versions else []):  # the base model: always
            if v in complete or v in self._syncing:
                continue
            if v != BASE_VERSION and window_full and v < min(newer):
                continue  # older than everything we keep: it would be pruned at once
            self._start_sync(v)

    def _start_sync(self, v: int) -> None:
        if v in self._syncing:
            return
        t = asyncio.create_task(self._sync(v))
        self._syncing[v] = t
        t.add_done_callback(lambda _t, v=v: self._syncing.pop(v, None))

    async def _sync(self, v: int) -> None:
        assert self._session is not None
        vdir = self.root / f"v{v}"
        t0 = time.perf_counter()
        bytes0 = sum(s.bytes for s in self.pool)
        backoff = 0.2
        m: Manifest | None = None
        while m is None:
            local = vdir / MANIFEST_NAME
            try:
                if local.exists():
                    m = verify_manifest(local.read_bytes(), self.pub, expect_version=v)
                    break
                m, raw = await get_manifest_raw(self._session, self.pool, v, self.pub)
                vdir.mkdir(exist_ok=True)
                atomic_write(local, raw)
            except (FetchError, LayoutError, OSError) as e:
                log.warning("relay %s: manifest v%d: %s", self.root, v, e)
                m = None
                if not any(v in s.versions for s in self.pool):
                    return  # no upstream offers it any more
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
        if v not in self.server.partial:
            have = {i for i in range(1, m.num_shards + 1) if (vdir / shard_name(i)).exists()}
            self.server.set_partial(v, m.num_shards, have)
        sink = _RelaySink(vdir, m, self.server, self.prom)
        try:
            while True:
                todo = [i for i in range(1, m.num_shards + 1) if not (vdir / shard_name(i)).exists()]
                if not todo:
                    break
                try:
                    await download_shards(self._session, self.pool, m, todo, sink, options=self.upstream_options)
                except FetchError as e:
                    if not any(v in s.versions for s in self.pool):
                        log.warning("relay %s: v%d withdrawn upstream; abandoning it", self.root, v)
                        self.server.drop_partial(v)
                        shutil.rmtree(vdir, ignore_errors=True)
                        return
                    log.warning("relay %s: v%d: %s; retrying", self.root, v, e)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
        finally:
            sink.close()
        self._commit(m)
        self.prom.versions_synced.inc()
        if self._metrics is not None:
            self._metrics.write(event="relay_synced", version=v, size=m.size, num_shards=m.num_shards,
                                seconds=time.perf_counter() - t0,
                                bytes_fetched=sum(s.bytes for s in self.pool) - bytes0,
                                by_upstream={s.url: s.bytes for s in self.pool})

    def _commit(self, m: Manifest) -> None:
        entries = [e for e in self._complete_entries() if e.version != m.version] + [m.dist_entry()]
        keep, drop = retain(entries, self.keep)
        atomic_write(self.root / DISTRIBUTION_NAME, format_distribution(keep).encode())
        self.server.refresh()
        self.synced.append(m.version)
        for e in drop:
            shutil.rmtree(self.root / f"v{e.version}", ignore_errors=True)
        if m.version not in {e.version for e in keep}:
            shutil.rmtree(self.root / f"v{m.version}", ignore_errors=True)
