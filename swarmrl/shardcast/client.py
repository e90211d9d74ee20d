"""The SHARDCAST client: fetch one signed version from several servers in parallel.

    from swarmrl.shardcast import fetch
    res = fetch(["http://relay-a:8601", "http://relay-b:8601"], out="model.safetensors",
                origin_pubkey="origin.key.pub", version="latest")
    res.version, res.path, res.blake3

How it works: ask every server what it has (``/versions.json``, long-poll capable; a plain static
server's ``distribution.txt`` also works for discovery), pick the version, get its manifest from any
server and verify the origin's Ed25519 signature (a forged or altered manifest is rejected and
that server excluded). Then shards are fetched ``parallel`` at a time; each shard goes to the
server with the best measured throughput per active download (unmeasured servers are probed
first), is written at its offset into a temporary file and checked against the signed per-shard
BLAKE3 hash. A server that serves a bad shard is excluded at once and the shard re-fetched
elsewhere; a server failing ``max_server_failures`` times in a row is excluded; an interrupted
shard resumes with a Range request; each shard gets at most ``max_attempts`` tries, after which
a ``FetchError`` says what each server did. The whole file is re-hashed against the signed
checksum (``verify_whole``) and only then renamed to ``out``. No probe file is ever needed.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

import aiohttp
import blake3

from swarmrl.shardcast.layout import (DISTRIBUTION_NAME, MANIFEST_NAME, MAX_DISTRIBUTION_BYTES,
                                      MAX_MANIFEST_BYTES, LayoutError, Manifest, atomic_write,
                                      parse_distribution, shard_relpath)
from swarmrl.shardcast.signing import load_public_key, verify_manifest

__all__ = ["FetchError", "FetchResult", "ServerPool", "fetch", "fetch_async", "discover", "get_manifest",
           "download_shards", "ShardSink", "FileSink", "hash_file"]

_EMA = 0.3
STALL_WINDOW_S = 10.0
DEFAULT_MIN_BPS = 32 * 1024


class FetchError(RuntimeError):
    """A fetch could not complete; the message says what each server did."""


@dataclass
class ServerState:
    url: str
    ema_bps: float | None = None
    active: int = 0
    failures: int = 0  # consecutive
    excluded_until: float = 0.0
    reason: str | None = None
    bytes: int = 0
    shards: int = 0
    versions: set[int] = field(default_factory=set)
    last_error: str | None = None

    def excluded(self, now: float) -> bool:
        return now < self.excluded_until


class ServerPool:
    """Health and throughput bookkeeping for a set of servers.

    ``exclude_s``: how long an excluded server stays out (``float('inf')`` for a one-shot fetch;
    a long-running relay uses a finite time so a healed upstream comes back).
    """

    def __init__(self, urls: Iterable[str], *, max_failures: int = 3, exclude_s: float = float("inf")) -> None:
        self.servers = {u.rstrip("/"): ServerState(u.rstrip("/")) for u in urls}
        if not self.servers:
            raise ValueError("no servers given")
        self.max_failures = max_failures
        self.exclude_s = exclude_s

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.servers.values())

    def healthy(self) -> list[ServerState]:
        now = time.monotonic()
        return [s for s in self.servers.values() if not s.excluded(now)]

    def exclude(self, s: ServerState, reason: str) -> None:
        s.excluded_until = time.monotonic() + self.exclude_s
        s.reason = reason

    def failure(self, s: ServerState, err: str) -> None:
        s.failures += 1
        s.last_error = err
        if s.failures >= self.max_failures:
            self.exclude(s, f"{s.failures} consecutive failures, last: {err}")

    def success(self, s: ServerState, nbytes: int, seconds: float) -> None:
        s.failures = 0
        s.bytes += nbytes
        s.shards += 1
        if nbytes >= 16384 and seconds > 0:
            bps = nbytes / seconds
            s.ema_bps = bps if s.ema_bps is None else _EMA * bps + (1 - _EMA) * s.ema_bps
        if s.reason and not s.excluded(time.monotonic()):
            s.reason = None

    def pick(self, version: int, avoid: set[str]) -> ServerState | None:
        """Best server for the next shard: unmeasured idle servers first (probing), then the
        highest expected throughput per concurrent download."""
        now = time.monotonic()
        cands = [s for s in self.servers.values()
                 if not s.excluded(now) and version in s.versions and s.url not in avoid]
        if not cands:
            return None
        measured = [s.ema_bps for s in cands if s.ema_bps]
        default = max(measured) if measured else 1e9
        def score(s: ServerState) -> float:
            if s.ema_bps is None and s.active == 0:
                return float("inf")
            return (s.ema_bps or default) / (s.active + 1)
        best = max(score(s) for s in cands)
        top = [s for s in cands if score(s) >= best * 0.98]
        return random.choice(top)

    def report(self) -> str:
        parts = []
        for s in self.servers.values():
            st = f"excluded ({s.reason})" if s.reason else (f"last error: {s.last_error}" if s.last_error else "ok")
            parts.append(f"{s.url}: {st}")
        return "; ".join(parts)


def _timeout(total: float | None = None, read: float = 30.0) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=total, connect=10.0, sock_read=read)


async def _read_limited(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    if resp.content_length is not None and resp.content_length > limit:
        raise LayoutError(f"response of {resp.content_length} bytes exceeds limit {limit}")
    buf = bytearray()
    async for chunk in resp.content.iter_any():
        buf += chunk
        if len(buf) > limit:
            raise LayoutError(f"response exceeds limit {limit}")
    return bytes(buf)


async def server_versions(session: aiohttp.ClientSession, url: str, *, since: int | None = None,
                          wait: float = 0.0) -> tuple[set[int], set[int], int | None]:
    """(complete, partial, seq) from one server; falls back to distribution.txt for static servers."""
    q = f"?since={since}&wait={wait}" if since is not None and wait > 0 else ""
    async with session.get(f"{url}/versions.json{q}", timeout=_timeout(wait + 15.0)) as r:
        if r.status == 200:
            try:
                data = json.loads(await _read_limited(r, 1 << 20))
            except (ValueError, RecursionError) as e:
                raise LayoutError(f"versions.json is not JSON: {type(e).__name__}") from None
            if not isinstance(data, dict):
                raise LayoutError("versions.json is not an object")
            comp = {int(v) for v in data.get("complete", []) if type(v) is int and v > 0}
            part = {int(k) for k in (data.get("partial") or {}) if str(k).isdigit() and int(k) > 0}
            seq = data.get("seq")
            return comp, part, seq if type(seq) is int else None
        if r.status != 404:
            raise aiohttp.ClientResponseError(r.request_info, (), status=r.status, message="versions.json")
    async with session.get(f"{url}/{DISTRIBUTION_NAME}", timeout=_timeout(15.0)) as r:
        r.raise_for_status()
        entries = parse_distribution(await _read_limited(r, MAX_DISTRIBUTION_BYTES))
    return {e.version for e in entries}, set(), None


async def discover(session: aiohttp.ClientSession, pool: ServerPool,
                   which: list[ServerState] | None = None, count_failures: bool = True) -> None:
    """Refresh every server's advertised versions; unreachable servers count a failure (unless
    ``count_failures`` is False: while waiting for a version, a server still starting up is fine)."""
    async def one(s: ServerState) -> None:
        try:
            comp, part, _ = await server_versions(session, s.url)
            s.versions = comp | part
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, LayoutError, ValueError) as e:
            msg = f"discovery: {type(e).__name__}: {e}"
            if count_failures:
                pool.failure(s, msg)
            else:
                s.last_error = msg
    await asyncio.gather(*(one(s) for s in (pool.healthy() if which is None else which)))


async def get_manifest(session: aiohttp.ClientSession, pool: ServerPool, version: int, pub: Any) -> Manifest:
    """Fetch + verify v<version>/manifest.json from the servers that list it."""
    return (await get_manifest_raw(session, pool, version, pub))[0]


async def get_manifest_raw(session: aiohttp.ClientSession, pool: ServerPool, version: int, pub: Any
                           ) -> tuple[Manifest, bytes]:
    """Like get_manifest, also returning the verified envelope bytes (a relay stores them as-is)."""
    errors = []
    cands = [s for s in pool.healthy() if version in s.versions]
    random.shuffle(cands)
    for s in cands:
        try:
            async with session.get(f"{s.url}/v{version}/{MANIFEST_NAME}", timeout=_timeout(30.0)) as r:
                r.raise_for_status()
                data = await _read_limited(r, MAX_MANIFEST_BYTES)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, LayoutError) as e:
            pool.failure(s, f"manifest v{version}: {type(e).__name__}: {e}")
            errors.append(f"{s.url}: {e}")
            continue
        try:
            return verify_manifest(data, pub, expect_version=version), data
        except LayoutError as e:  # includes SignatureError: a forged or altered manifest
            pool.exclude(s, f"invalid manifest for v{version}: {e}")
            errors.append(f"{s.url}: invalid manifest: {e}")
    raise FetchError(f"no server served a valid signed manifest for v{version}: " + ("; ".join(errors) or
                     "no server lists it"))


class ShardSink(Protocol):
    def resume_from(self, index: int) -> tuple[int, Any]:
        """(bytes already held for this shard, blake3 hasher fed with them)."""

    def write(self, index: int, pos: int, data: bytes | memoryview) -> None: ...

    def reset(self, index: int) -> None: ...

    def done(self, index: int) -> None: ...


class FileSink:
    """Writes every shard at its offset of one preallocated file."""

    def __init__(self, path: Path, manifest: Manifest) -> None:
        self.path = path
        self.m = manifest
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(self.fd).st_size != manifest.size:
            os.ftruncate(self.fd, manifest.size)

    def resume_from(self, index: int) -> tuple[int, Any]:
        return 0, blake3.blake3()

    def write(self, index: int, pos: int, data: bytes | memoryview) -> None:
        off = self.m.shard_offset(index) + pos
        view = memoryview(data)
        while view:
            n = os.pwrite(self.fd, view, off)
            view = view[n:]
            off += n

    def reset(self, index: int) -> None:
        pass

    def done(self, index: int) -> None:
        pass

    def verify_existing(self, index: int) -> bool:
        info = self.m.shards[index - 1]
        data = os.pread(self.fd, info.size, self.m.shard_offset(index))
        return len(data) == info.size and blake3.blake3(data).hexdigest() == info.blake3

    def close(self) -> None:
        os.close(self.fd)


class _BadShard(Exception):
    pass


async def _fetch_one_shard(session: aiohttp.ClientSession, pool: ServerPool, m: Manifest, index: int,
                           sink: ShardSink, max_attempts: int, read_timeout: float,
                           min_bps: float = DEFAULT_MIN_BPS, not_ready_s: float = 600.0) -> None:
    info = m.shards[index - 1]
    shard_t0 = time.monotonic()
    got, hasher = sink.resume_from(index)
    sources: set[str] = set()
    avoid: set[str] = set()
    attempts = 0
    errors: list[str] = []
    while True:
        if got == info.size:
            if hasher.hexdigest() == info.blake3:
                sink.done(index)
                return
            if len(sources) == 1:
                (bad,) = sources
                pool.exclude(pool.servers[bad], f"served a corrupt shard {index} of v{m.version}")
                errors.append(f"{bad}: corrupt shard")
            else:
                errors.append(f"corrupt shard assembled from {sorted(sources) or 'resumed data'}")
            got, hasher, sources = 0, blake3.blake3(), set()
            sink.reset(index)
        if attempts >= max_attempts:
            raise FetchError(f"shard {index} of v{m.version}: gave up after {attempts} attempts: "
                             + "; ".join(errors[-max_attempts:]) + f" | servers: {pool.report()}")
        s = pool.pick(m.version, avoid)
        if s is None:
            avoid.clear()
            s = pool.pick(m.version, avoid)
            if s is None:
                attempts += 1
                if attempts >= max_attempts or not pool.healthy():
                    raise FetchError(f"shard {index} of v{m.version}: no usable server left ({pool.report()})"
                                     + (f"; errors: {'; '.join(errors[-5:])}" if errors else ""))
                await asyncio.sleep(min(0.5 * attempts, 3.0))  # servers may still learn of the version
                continue
            await asyncio.sleep(min(0.1 * attempts, 2.0))
        attempts += 1
        s.active += 1
        t0 = time.perf_counter()
        n0 = got
        try:
            headers = {"Range": f"bytes={got}-{info.size - 1}"} if got else {}
            async with session.get(f"{s.url}/{shard_relpath(m.version, index)}", headers=headers,
                                   timeout=_timeout(None, read_timeout)) as r:
                if r.status == 206:
                    cr = r.headers.get("Content-Range", "")
                    if not cr.startswith(f"bytes {got}-"):
                        raise _BadShard(f"bad Content-Range {cr[:60]!r} for resume at {got}")
                elif r.status == 200:
                    if got:
                        got, hasher, sources = 0, blake3.blake3(), set()
                        sink.reset(index)
                        n0 = 0
                else:
                    raise aiohttp.ClientResponseError(r.request_info, (), status=r.status,
                                                      message=r.reason or "")
                sources.add(s.url)
                t_first = time.perf_counter()
                async for chunk in r.content.iter_any():
                    if got + len(chunk) > info.size:
                        raise _BadShard(f"shard {index} longer than {info.size} bytes")
                    sink.write(index, got, chunk)
                    hasher.update(chunk)
                    got += len(chunk)
                    el = time.perf_counter() - t_first
                    if el > STALL_WINDOW_S and (got - n0) / el < min_bps:
                        raise asyncio.TimeoutError(f"trickling at {(got - n0) / el:.0f} B/s < {min_bps:.0f} B/s")
            if got < info.size:
                raise aiohttp.ClientPayloadError(f"short shard: {got}/{info.size} bytes")
            pool.success(s, got - n0, time.perf_counter() - t0)
        except _BadShard as e:
            pool.exclude(s, str(e))
            errors.append(f"{s.url}: {e}")
            got, hasher, sources = 0, blake3.blake3(), set()
            sink.reset(index)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            msg = f"{type(e).__name__}: {e}"
            errors.append(f"{s.url}: {msg}")
            avoid.add(s.url)
            if isinstance(e, aiohttp.ClientResponseError) and e.status == 503:
                # not there yet (a relay's pipelining hold expired): neither a health failure nor a
                # spent attempt, but bounded by not_ready_s without any byte of this shard
                s.last_error = msg
                attempts -= 1
                if time.monotonic() - shard_t0 > not_ready_s:
                    raise FetchError(f"shard {index} of v{m.version}: not available anywhere within "
                                     f"{not_ready_s:.0f} s | servers: {pool.report()}") from None
            else:
                pool.failure(s, msg)
        finally:
            s.active -= 1


async def download_shards(session: aiohttp.ClientSession, pool: ServerPool, m: Manifest, indices: list[int],
                          sink: ShardSink, *, parallel: int = 8, max_attempts: int = 6,
                          read_timeout: float = 30.0, on_shard: Callable[[int], None] | None = None,
                          refresh_s: float | None = None) -> None:
    """Fetch ``indices`` of ``m`` into ``sink``. ``refresh_s``: re-ask servers that do not list the
    version yet that often (a relay that is still learning of it joins in when it does)."""
    queue = list(indices)
    queue.reverse()

    async def worker() -> None:
        while queue:
            idx = queue.pop()
            await _fetch_one_shard(session, pool, m, idx, sink, max_attempts, read_timeout)
            if on_shard:
                on_shard(idx)

    async def refresher() -> None:
        while True:
            await asyncio.sleep(refresh_s)
            lagging = [s for s in pool.healthy() if m.version not in s.versions]
            if lagging:
                await discover(session, pool, lagging)

    tasks = [asyncio.create_task(worker()) for _ in range(max(1, min(parallel, len(indices))))]
    helper = [asyncio.create_task(refresher())] if refresh_s else []
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks + helper:
            t.cancel()
        await asyncio.gather(*tasks, *helper, return_exceptions=True)


class _InOrderHasher:
    """Hashes the output file's whole-file BLAKE3 on a thread, shard by shard in order, as soon as
    each prefix of verified shards is on disk, so the final check overlaps the download."""

    def __init__(self, path: Path, m: Manifest, done: set[int]) -> None:
        self.m = m
        self.h = blake3.blake3()
        self.next = 1
        self.ready = set(done)
        self.cv = threading.Condition()
        self.closed = False
        self.fd = os.open(path, os.O_RDONLY)
        self.thread = threading.Thread(target=self._run, name="shardcast-hash", daemon=True)
        self.thread.start()

    def mark(self, index: int) -> None:
        with self.cv:
            self.ready.add(index)
            self.cv.notify()

    def _run(self) -> None:
        n = self.m.num_shards
        while self.next <= n:
            with self.cv:
                while self.next not in self.ready and not self.closed:
                    self.cv.wait()
                if self.next not in self.ready:
                    return
            off, left = self.m.shard_offset(self.next), self.m.shards[self.next - 1].size
            while left:
                data = os.pread(self.fd, min(left, 8 << 20), off)
                if not data:
                    return  # file shorter than expected: finish() reports a mismatch
                self.h.update(data)
                off += len(data)
                left -= len(data)
            self.next += 1

    def finish(self) -> str | None:
        """The digest once every shard was hashed (None if the thread stopped early)."""
        self.close()
        return self.h.hexdigest() if self.next > self.m.num_shards else None

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify()
        self.thread.join()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def hash_file(path: Path) -> str:
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    h.update_mmap(str(path))
    return h.hexdigest()


@dataclass
class FetchResult:
    version: int
    path: Path
    size: int
    blake3: str
    seconds: float
    manifest: Manifest
    bytes_by_server: dict[str, int]
    excluded: dict[str, str]
    resumed_shards: int = 0

    @property
    def mb_per_s(self) -> float:
        return self.size / 1e6 / self.seconds if self.seconds > 0 else float("inf")


def new_session(limit: int = 64) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit, limit_per_host=0,
                                                                force_close=False),
                                 auto_decompress=False, read_bufsize=1 << 20)


async def fetch_async(servers: Iterable[str], out: str | Path, origin_pubkey: Any, *,
                      version: int | str = "latest", parallel: int = 8, max_attempts: int = 6,
                      max_server_failures: int = 3, wait_s: float = 0.0, verify_whole: bool = True,
                      fsync: bool = False, read_timeout: float = 30.0, min_version: int = 0,
                      on_shard: Callable[[int, int], None] | None = None) -> FetchResult:
    """Async fetch; see module docstring. ``version``: an int or "latest" (highest version any
    server advertises whose signed manifest verifies, and >= ``min_version``). ``wait_s``: keep
    polling that long for the version to appear. ``on_shard(done, total)``: progress callback."""
    t0 = time.perf_counter()
    pub = load_public_key(origin_pubkey)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pool = ServerPool(servers, max_failures=max_server_failures)
    want = None if version == "latest" else int(version)
    deadline = time.monotonic() + wait_s
    async with new_session() as session:
        manifest = None
        last_err: Exception | None = None
        while manifest is None:
            await discover(session, pool, count_failures=time.monotonic() >= deadline)
            listed = sorted({v for s in pool.healthy() for v in s.versions
                             if (v == want if want is not None else v >= max(min_version, 1))}, reverse=True)
            for v in listed:
                try:
                    manifest = await get_manifest(session, pool, v, pub)
                    break
                except FetchError as e:
                    last_err = e
            if manifest is None:
                if time.monotonic() >= deadline:
                    what = f"v{want}" if want is not None else "any version"
                    detail = f" ({last_err})" if last_err else ""
                    raise FetchError(f"no server offers {what}{detail}; servers: {pool.report()}")
                await asyncio.sleep(0.25)

        tmp = out.parent / f".{out.name}.part"
        state_path = out.parent / f".{out.name}.part.json"
        sink = FileSink(tmp, manifest)
        done: set[int] = set()
        try:
            # resume across runs: shards recorded as done for this exact manifest, re-verified
            try:
                st = json.loads(state_path.read_text())
                if st.get("version") == manifest.version and st.get("blake3") == manifest.blake3:
                    done = {i for i in st.get("done", []) if type(i) is int and 1 <= i <= manifest.num_shards
                            and sink.verify_existing(i)}
            except (OSError, ValueError):
                pass
            resumed = len(done)
            todo = [i for i in range(1, manifest.num_shards + 1) if i not in done]
            last_save = [time.monotonic()]

            def save_progress() -> None:
                last_save[0] = time.monotonic()
                atomic_write(state_path, json.dumps({"version": manifest.version, "blake3": manifest.blake3,
                                                     "done": sorted(done)}).encode(), fsync=False)

            hasher = _InOrderHasher(tmp, manifest, done) if verify_whole else None

            def shard_done(idx: int) -> None:
                done.add(idx)
                if hasher is not None:
                    hasher.mark(idx)
                if time.monotonic() - last_save[0] > 0.5:
                    save_progress()  # a killed process loses at most ~0.5 s of verified shards
                if on_shard:
                    on_shard(len(done), manifest.num_shards)

            try:
                await download_shards(session, pool, manifest, todo, sink, parallel=parallel,
                                      max_attempts=max_attempts, read_timeout=read_timeout, on_shard=shard_done,
                                      refresh_s=1.0)
            except BaseException:
                if done:
                    save_progress()  # the next fetch of this version into ``out`` resumes from here
                if hasher is not None:
                    hasher.close()
                raise
            if fsync:
                await asyncio.to_thread(os.fsync, sink.fd)
        finally:
            sink.close()
    if hasher is not None:
        digest = await asyncio.to_thread(hasher.finish)
        if digest != manifest.blake3:
            tmp.unlink(missing_ok=True)
            state_path.unlink(missing_ok=True)
            raise FetchError(f"v{manifest.version}: whole-file BLAKE3 {digest} != signed {manifest.blake3}")
    os.replace(tmp, out)
    state_path.unlink(missing_ok=True)
    return FetchResult(version=manifest.version, path=out, size=manifest.size, blake3=manifest.blake3,
                       seconds=time.perf_counter() - t0, manifest=manifest,
                       bytes_by_server={s.url: s.bytes for s in pool},
                       excluded={s.url: s.reason for s in pool if s.reason}, resumed_shards=resumed)


def fetch(servers: Iterable[str], out: str | Path, origin_pubkey: Any, **kw: Any) -> FetchResult:
    """Synchronous wrapper of :func:`fetch_async` (for worker code without an event loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(fetch_async(list(servers), out, origin_pubkey, **kw))
    raise RuntimeError("fetch() called from a running event loop; await fetch_async() instead")
