"""SHARDCAST client, shards: fetching each shard from the best server with resume, per-shard BLAKE3
checks and exclusion of bad servers (``download_shards``) and the sinks shards are written to (the whole-file
hash that follows the download is in ``swarmrl.shardcast.client.wholehash``).

Progress deadline (``FetchOptions``): a server must answer a shard request within ``read_timeout`` (longer than
a relay's pipelining hold), then keep bytes coming: no byte for ``stall_s`` seconds, or fewer than ``min_bps``
bytes per second over the last ``window_s`` seconds, and the server is dropped for this shard (excluded
from the fetch when another server offers the version, else a failure is counted) and the shard is fetched
from another; the bytes already verified-so-far are kept and resumed with a Range request. So one slow or
stalling server costs a shard at most ``max(stall_s, window_s + stall_s)`` seconds, not a whole timeout
per attempt."""

from __future__ import annotations

import asyncio
import errno
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import blake3

from swarmrl.shardcast.client.http_get import BadResponse, HTTPStatus, RawPool, RawResponse
from swarmrl.shardcast.client.options import FetchOptions
from swarmrl.shardcast.client.pool import FetchError, ServerPool, ServerState, discover
from swarmrl.shardcast.layout import Manifest, shard_relpath


class Stalled(TimeoutError):
    """A server missed the progress deadline for a shard (the message says which)."""


class _Deadline:
    """The progress deadline of one shard request (``FetchOptions``): ``read_timeout`` to the response headers,
    then ``stall_s`` after each byte, and a minimum rate over a sliding window. ``data`` raises ``Stalled`` when
    it is missed; the timer (``asyncio.timeout``) fires it when nothing arrives at all."""

    def __init__(self, options: FetchOptions) -> None:
        self.loop = asyncio.get_running_loop()
        self.head_s, self.stall_s = options.read_timeout, options.stall_s
        self.min_bps, self.window_s = options.min_bps, options.window_s
        self.t0 = self.loop.time()
        self.body_t0: float | None = None
        self.got = 0
        self.samples: deque[tuple[float, int]] = deque()
        self.timer: asyncio.Timeout | None = None

    def start(self, timer: asyncio.Timeout) -> None:
        self.timer = timer
        timer.reschedule(self.t0 + self.head_s)

    def headers(self) -> None:
        now = self.loop.time()
        self.body_t0 = now
        self.samples.append((now, 0))
        self.timer.reschedule(now + self.stall_s)

    def data(self, n: int) -> None:
        now = self.loop.time()
        self.got += n
        self.samples.append((now, self.got))
        while len(self.samples) > 1 and self.samples[1][0] <= now - self.window_s:
            self.samples.popleft()
        t_old, got_old = self.samples[0]
        if now - self.body_t0 >= self.window_s and now - t_old >= self.window_s:
            rate = (self.got - got_old) / (now - t_old)
            if rate < self.min_bps:
                raise Stalled(f"{rate:.0f} B/s over the last {now - t_old:.1f} s, under the minimum "
                              f"{self.min_bps:.0f} B/s (after {self.got} bytes)")
        self.timer.reschedule(now + self.stall_s)

    def missed(self) -> Stalled:
        if self.body_t0 is None:
            return Stalled(f"no response within {self.head_s:g} s")
        return Stalled(f"no bytes for {self.stall_s:g} s (after {self.got} bytes)")


class ShardSink(Protocol):
    """Where shard bytes go. A sink whose ``threadsafe`` attribute is true has ``write`` (and what it calls)
    called from a writer thread, in order per shard, while the event loop reads the next bytes."""

    def resume_from(self, index: int) -> tuple[int, Any]:
        """(bytes already held for this shard, blake3 hasher fed with them)."""

    def write(self, index: int, pos: int, data: bytes | memoryview) -> None: ...

    def reset(self, index: int) -> None: ...

    def done(self, index: int) -> None: ...


def _preallocate(fd: int, size: int) -> None:
    """Reserve the file's blocks now: a disk without room fails here, before any byte is fetched, and the writes
    that follow fill allocated blocks (faster than allocating them write by write). Where the file system cannot
    (EOPNOTSUPP, EINVAL), the file is only extended, sparse."""
    if size == 0:
        os.ftruncate(fd, 0)
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        if os.fstat(fd).st_size != size:
            os.ftruncate(fd, size)


class FileSink:
    """Writes every shard at its offset of one preallocated file (from writer threads: ``threadsafe``)."""

    threadsafe = True

    def __init__(self, path: Path, manifest: Manifest) -> None:
        self.path = path
        self.m = manifest
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(self.fd).st_size > manifest.size:
                os.ftruncate(self.fd, manifest.size)
            _preallocate(self.fd, manifest.size)
        except BaseException:
            os.close(self.fd)
            raise
        # (shard, contiguous bytes written, the bytes just written: valid during the call)
        self.on_write: Callable[[int, int, memoryview], None] | None = None
        self.on_reset: Callable[[int], None] | None = None

    def resume_from(self, index: int) -> tuple[int, Any]:
        return 0, blake3.blake3()

    def write(self, index: int, pos: int, data: bytes | memoryview) -> None:
        off = self.m.shard_offset(index) + pos
        view = memoryview(data)
        end = pos + len(view)
        while view:
            n = os.pwrite(self.fd, view, off)
            view = view[n:]
            off += n
        if self.on_write is not None:
            self.on_write(index, end, memoryview(data))

    def reset(self, index: int) -> None:
        if self.on_reset is not None:
            self.on_reset(index)

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


@dataclass
class _BodyState:
    """Where one shard download stands (shared with the raw client's callbacks)."""

    got: int
    hasher: Any
    sources: set[str]
    n0: int  # bytes held when this request started
    write_failed: bool = False  # a writer thread's write or hash failed: what is held is unknown


async def _fetch_one_shard(raw: RawPool, pool: ServerPool, m: Manifest, index: int, sink: ShardSink,
                           options: FetchOptions, writer: ThreadPoolExecutor | None = None) -> None:
    """``writer``: a one-thread executor that writes and hashes each received buffer while the event loop reads
    the next (a ``threadsafe`` sink only); without it both happen on the event loop."""
    f = _ShardFetch(raw, pool, m, index, sink, options, writer)
    while True:
        if f.got == f.info.size and f.verified():
            return
        f.give_up_if_spent()
        s, delay = f.pick()
        if delay is not None:
            await asyncio.sleep(delay)
        if s is None:
            continue
        f.attempts += 1
        s.active += 1
        try:
            await f.request(s)
        except _BadShard as e:
            f.bad_shard(s, e)
        except Stalled as e:
            f.stalled(s, e)
        except (TimeoutError, OSError) as e:
            f.failed(s, e)
        finally:
            s.active -= 1


class _ShardFetch:
    """One shard's download across its attempts: what is held (bytes, their hasher, the servers they came from),
    the servers to avoid for it, the attempts and errors so far. ``_fetch_one_shard`` runs the loop; the methods
    are its steps (only ``request`` awaits, once per attempt: the per-buffer callbacks are as they were)."""

    def __init__(self, raw: RawPool, pool: ServerPool, m: Manifest, index: int, sink: ShardSink,
                 options: FetchOptions, writer: ThreadPoolExecutor | None) -> None:
        self.raw, self.pool, self.m, self.index, self.sink, self.writer = raw, pool, m, index, sink, writer
        self.options = options
        self.max_attempts, self.not_ready_s = options.max_attempts, options.not_ready_s
        self.info = m.shards[index - 1]
        self.t0 = time.monotonic()
        self.got, self.hasher = sink.resume_from(index)
        self.sources: set[str] = set()
        self.avoid: set[str] = set()
        self.attempts = 0
        self.errors: list[str] = []
        self.local_failure = False  # the last request failed writing here, not on the server's side

    def _restart(self) -> None:
        """Drop what is held of the shard: it is fetched from its first byte."""
        self.got, self.hasher, self.sources = 0, blake3.blake3(), set()
        self.sink.reset(self.index)

    def verified(self) -> bool:
        """Every byte is held: True when they hash to the signed BLAKE3 (the shard is done); else the server that
        served them all is excluded, they are dropped, and False."""
        pool, index = self.pool, self.index
        if self.hasher.hexdigest() == self.info.blake3:
            self.sink.done(index)
            return True
        if len(self.sources) == 1:
            (bad,) = self.sources
            pool.exclude(pool.servers[bad], f"served a corrupt shard {index} of v{self.m.version}")
            self.errors.append(f"{bad}: corrupt shard")
        else:
            self.errors.append(f"corrupt shard assembled from {sorted(self.sources) or 'resumed data'}")
        self._restart()
        return False

    def give_up_if_spent(self) -> None:
        if self.attempts >= self.max_attempts:
            raise FetchError(f"shard {self.index} of v{self.m.version}: gave up after {self.attempts} attempts: "
                             + "; ".join(self.errors[-self.max_attempts:]) + f" | servers: {self.pool.report()}")

    def pick(self) -> tuple[ServerState | None, float | None]:
        """The server for the next attempt and how long to wait first (None: not at all). When every server
        offering the version is avoided, the avoided ones are tried again after a pause; when none is usable,
        (None, a pause) counts as an attempt (servers may still learn of the version)."""
        pool, version = self.pool, self.m.version
        s = pool.pick(version, self.avoid)
        if s is not None:
            return s, None
        self.avoid.clear()
        s = pool.pick(version, self.avoid)
        if s is None:
            self.attempts += 1
            if self.attempts >= self.max_attempts or not pool.healthy():
                raise FetchError(f"shard {self.index} of v{version}: no usable server left ({pool.report()})"
                                 + (f"; errors: {'; '.join(self.errors[-5:])}" if self.errors else ""))
            return None, min(0.5 * self.attempts, 3.0)
        return s, min(0.1 * self.attempts, 2.0)

    async def request(self, s: ServerState) -> None:
        """One request for the rest of the shard from ``s`` under the progress deadline (resumed with a Range
        request when bytes are held). Whatever happens, the bytes that arrived are held afterwards."""
        raw, pool, m, index, sink, info, writer = self.raw, self.pool, self.m, self.index, self.sink, self.info, self.writer
        t0 = time.perf_counter()
        self.local_failure = False
        deadline = _Deadline(self.options)
        got = self.got
        headers = {"Range": f"bytes={got}-{info.size - 1}"} if got else {}
        state = _BodyState(got, self.hasher, self.sources, got)

        def on_head(r: RawResponse, s: ServerState = s, st: _BodyState = state, dl: _Deadline = deadline) -> int:
            dl.headers()
            if r.status == 206:
                cr = r.headers.get("content-range", "")
                if not cr.startswith(f"bytes {st.got}-"):
                    raise _BadShard(f"bad Content-Range {cr[:60]!r} for resume at {st.got}")
            elif r.status == 200:
                if st.got:
                    st.got, st.hasher, st.sources = 0, blake3.blake3(), set()
                    sink.reset(index)
                    st.n0 = 0
            else:
                raise HTTPStatus(r.status, r.reason)
            st.sources.add(s.url)
            if r.length is not None and r.length > info.size - st.got:
                raise _BadShard(f"shard {index} longer than {info.size} bytes")
            return info.size - st.got

        def on_data(view: memoryview, st: _BodyState = state, dl: _Deadline = deadline) -> Future | None:
            n = len(view)
            if st.got + n > info.size:
                raise _BadShard(f"shard {index} longer than {info.size} bytes")
            dl.data(n)  # (a missed deadline drops these bytes: not counted, not written)
            if writer is None:
                _write_and_hash(sink, index, st.got, view, st)
                st.got += n
                return None
            fut = writer.submit(_write_and_hash, sink, index, st.got, view, st)
            st.got += n  # counted now, held once the thread is done (a request ends after its threads)
            return fut

        try:
            async with asyncio.timeout(None) as timer:
                deadline.start(timer)
                await raw.get(f"{s.url}/{shard_relpath(m.version, index)}", headers, on_head, on_data)
        except TimeoutError as e:
            if isinstance(e, Stalled) or timer.expired():
                raise (e if isinstance(e, Stalled) else deadline.missed()) from None
            raise
        finally:
            self.got, self.hasher, self.sources, n0 = state.got, state.hasher, state.sources, state.n0
            if state.write_failed:  # what this shard holds is unknown: start it over
                self.local_failure = True
                self._restart()
        if self.got < info.size:
            raise BadResponse(f"short shard: {self.got}/{info.size} bytes")
        pool.success(s, self.got - n0, time.perf_counter() - t0)

    def bad_shard(self, s: ServerState, e: _BadShard) -> None:
        """``s`` sent bytes that cannot be the shard: excluded, and the shard starts over."""
        self.pool.exclude(s, str(e))
        self.errors.append(f"{s.url}: {e}")
        self._restart()

    def stalled(self, s: ServerState, e: Stalled) -> None:
        """Dropped for this shard; out of the fetch when another server has the version (a lone slow server keeps
        its max_failures tries). Bytes already received stay and resume elsewhere by Range."""
        pool, m = self.pool, self.m
        msg = f"stalled on shard {self.index} of v{m.version}: {e}"
        self.errors.append(f"{s.url}: {msg}")
        self.avoid.add(s.url)
        if any(o is not s and m.version in o.versions for o in pool.healthy()):
            pool.exclude(s, msg)
        else:
            pool.failure(s, msg)

    def failed(self, s: ServerState, e: TimeoutError | OSError) -> None:
        """A failed request: counted against ``s``, except a 503 (not there yet) and a failure to write here (which
        ends the fetch: no server is to blame)."""
        index, m = self.index, self.m
        if self.local_failure:  # writing here failed (a full disk, a closed file): the fetch ends, no server blamed
            raise FetchError(f"shard {index} of v{m.version}: could not write it here: "
                             f"{type(e).__name__}: {e}") from e
        msg = f"{type(e).__name__}: {e}"
        self.errors.append(f"{s.url}: {msg}")
        self.avoid.add(s.url)
        if isinstance(e, HTTPStatus) and e.status == 503:
            # not there yet (a relay's pipelining hold expired): neither a health failure nor a
            # spent attempt, but bounded by not_ready_s without any byte of this shard
            s.last_error = msg
            self.attempts -= 1
            if time.monotonic() - self.t0 > self.not_ready_s:
                raise FetchError(f"shard {index} of v{m.version}: not available anywhere within "
                                 f"{self.not_ready_s:.0f} s | servers: {self.pool.report()}") from None
        else:
            self.pool.failure(s, msg)


def _write_and_hash(sink: ShardSink, index: int, pos: int, view: memoryview, st: _BodyState) -> None:
    """Write and hash one received buffer (on a writer thread, in order per shard, or on the event loop); a
    failure marks the request's bytes unknown (``write_failed``)."""
    try:
        sink.write(index, pos, view)
        st.hasher.update(view)
    except BaseException:
        st.write_failed = True
        raise


async def download_shards(session: RawPool, pool: ServerPool, m: Manifest, indices: list[int], sink: ShardSink, *,
                          options: FetchOptions = FetchOptions(), on_shard: Callable[[int], None] | None = None,
                          refresh_s: float | None = None) -> None:
    """Fetch ``indices`` of ``m`` into ``sink``, ``options.streams(servers)`` shards at a time, each under the
    options' attempts and progress deadline. ``refresh_s``: re-ask servers that do not list the version yet that
    often (a relay that is still learning of it joins in when it does)."""
    queue = list(indices)
    queue.reverse()
    raw = session
    n_workers = max(1, min(options.streams(len(pool.servers)), len(indices)))
    # a threadsafe sink is written and hashed on one thread per worker (in order per shard), off the event loop
    writers = [ThreadPoolExecutor(1, thread_name_prefix="shardcast-write") for _ in range(n_workers)] \
        if getattr(sink, "threadsafe", False) else []

    async def worker(writer: ThreadPoolExecutor | None) -> None:
        while queue:
            idx = queue.pop()
            await _fetch_one_shard(raw, pool, m, idx, sink, options, writer)
            if on_shard:
                on_shard(idx)

    async def refresher() -> None:
        while True:
            await asyncio.sleep(refresh_s)
            lagging = [s for s in pool.healthy() if m.version not in s.versions]
            if lagging:
                await discover(session, pool, lagging)

    tasks = [asyncio.create_task(worker(writers[i] if writers else None)) for i in range(n_workers)]
    helper = [asyncio.create_task(refresher())] if refresh_s else []
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks + helper:
            t.cancel()
        await asyncio.gather(*tasks, *helper, return_exceptions=True)
        for w in writers:
            w.shutdown(wait=True)  # (idle: every request waits for its writes before it ends)
