"""SHARDCAST client data path: buffers lent to writer threads (http_get), writes and hashes off the event loop
(download), and the whole-file hash fed from those buffers where it stands (real servers on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import blake3
import pytest
from _shardcast_util import make_file, same_file
from aiohttp import web

from swarmrl.shardcast import FetchError, FetchOptions, Origin, fetch_async
from swarmrl.shardcast.client import download as dl
from swarmrl.shardcast.client.http_get import BUFFERS, RawPool
from swarmrl.shardcast.client.pool import ServerPool, discover, get_manifest, new_session
from swarmrl.shardcast.client.wholehash import InOrderHasher
from swarmrl.shardcast.layout import Manifest, ShardInfo

SHARD = 1 << 20


async def _body_server(body: bytes) -> tuple[web.AppRunner, str]:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/octet-stream")

    app = web.Application()
    app.router.add_get("/blob", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/blob"


def test_lent_buffers_come_back_in_order_and_reading_pauses_while_all_are_lent():
    """A slow thread holds each buffer: the bytes still arrive whole and in order (a buffer is never refilled while
    lent), at most BUFFERS are lent at once (reading pauses), and the request ends only after the last job."""
    body = random.Random(3).randbytes(6 * (1 << 20) + 12345)
    got: list[bytes] = []
    outstanding = [0, 0]  # now, most
    lock = threading.Lock()

    def job(view: memoryview) -> None:
        time.sleep(0.01)  # slower than the loopback socket: the loop runs out of free buffers
        got.append(bytes(view))
        with lock:
            outstanding[0] -= 1

    async def main() -> None:
        runner, url = await _body_server(body)
        pool = RawPool()
        with ThreadPoolExecutor(1) as ex:
            def on_data(view: memoryview):  # noqa: ANN202
                with lock:
                    outstanding[0] += 1
                    outstanding[1] = max(outstanding[1], outstanding[0])
                return ex.submit(job, view)

            r = await pool.get(url, {}, lambda resp: len(body), on_data)
            assert r.status == 200
            assert outstanding[0] == 0  # every job done before get returned
        pool.close()
        await runner.cleanup()

    asyncio.run(main())
    assert b"".join(got) == body
    assert outstanding[1] <= BUFFERS


def test_a_failing_lent_buffer_fails_the_request_after_the_other_jobs():
    body = random.Random(4).randbytes(5 * (1 << 20))
    calls = [0]
    running = [0]

    def job(view: memoryview, n: int) -> None:
        running[0] += 1
        time.sleep(0.02)
        running[0] -= 1
        if n == 2:
            raise OSError(28, "No space left on device")

    async def main() -> None:
        runner, url = await _body_server(body)
        pool = RawPool()
        with ThreadPoolExecutor(2) as ex:
            def on_data(view: memoryview):  # noqa: ANN202
                calls[0] += 1
                return ex.submit(job, view, calls[0])

            with pytest.raises(OSError, match="No space left"):
                await pool.get(url, {}, lambda resp: len(body), on_data)
            assert running[0] == 0  # no job still holds a buffer once the error is raised
        assert pool.idle.get(("127.0.0.1", int(url.split(":")[2].split("/")[0])), []) == []  # connection dropped
        pool.close()
        await runner.cleanup()

    asyncio.run(main())


def test_a_write_failure_here_ends_the_fetch_and_blames_no_server(tmp_path, monkeypatch):
    """A local write error (a full disk) is not the server's fault: the fetch ends with a clear error instead of
    counting failures against (and excluding) an honest server."""
    origin = Origin(tmp_path / "origin", shard_size=SHARD)
    url = origin.serve()
    origin.publish_sync(make_file(tmp_path / "ckpt.bin", 4 * SHARD + 99, seed=5), version=1)
    writes = [0]
    real_write = dl.FileSink.write

    def failing_write(self, index, pos, data):  # noqa: ANN001, ANN202
        writes[0] += 1
        if writes[0] == 3:
            raise OSError(28, "No space left on device")
        return real_write(self, index, pos, data)

    monkeypatch.setattr(dl.FileSink, "write", failing_write)

    async def main() -> None:
        pool = ServerPool([url], max_failures=3)
        async with new_session() as session:
            await discover(session, pool)
            m = await get_manifest(session, pool, 1, origin.public_key)
            sink = dl.FileSink(tmp_path / "out.bin", m)
            try:
                with pytest.raises(FetchError, match="could not write it here.*No space left"):
                    await dl.download_shards(session, pool, m, list(range(1, m.num_shards + 1)), sink,
                                             options=FetchOptions(parallel=2))
            finally:
                sink.close()
        (s,) = pool.servers.values()
        assert s.failures == 0 and s.reason is None and not s.excluded(time.monotonic())

    try:
        asyncio.run(main())
    finally:
        origin.close()


def test_fetch_through_writer_threads_is_whole_and_verified(tmp_path):
    origin = Origin(tmp_path / "origin", shard_size=SHARD)
    url = origin.serve()
    ckpt = make_file(tmp_path / "ckpt.bin", 7 * SHARD + 4321, seed=6)
    origin.publish_sync(ckpt, version=1)
    try:
        res = asyncio.run(fetch_async([url], tmp_path / "out.bin", origin.public_key, options=FetchOptions(parallel=3)))
    finally:
        origin.close()
    assert same_file(res.path, ckpt) and res.blake3 == blake3.blake3(ckpt.read_bytes()).hexdigest()


def _hashed_sink(path, data: bytes, shard_size: int) -> tuple[Manifest, dl.FileSink, InOrderHasher]:
    """A manifest of ``data`` cut into ``shard_size`` shards, a FileSink for it at ``path`` and an in-order hasher
    fed by the sink's writes and resets."""
    shards = tuple(ShardInfo(len(data[i:i + shard_size]), blake3.blake3(data[i:i + shard_size]).hexdigest())
                   for i in range(0, len(data), shard_size))
    m = Manifest(version=1, size=len(data), shard_size=shard_size, blake3=blake3.blake3(data).hexdigest(),
                 shards=shards)
    sink = dl.FileSink(path, m)
    hasher = InOrderHasher(path, m, set())
    sink.on_write, sink.on_reset = hasher.progress, hasher.reset
    return m, sink, hasher


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_whole_file_hash_is_right_whatever_order_the_writers_go_in(tmp_path, seed):
    """Writer threads write chunks of several shards in a shuffled order (each shard in order): the in-order hash,
    fed from the writers' buffers where it stands and read back elsewhere, equals the file's BLAKE3."""
    rnd = random.Random(seed)
    shard_size, n_shards = 300_000, 5
    data = rnd.randbytes(shard_size * (n_shards - 1) + 77_777)
    path = tmp_path / "out.bin"
    m, sink, hasher = _hashed_sink(path, data, shard_size)
    shards = m.shards

    def write_shard(index: int) -> None:
        off = m.shard_offset(index)
        size = shards[index - 1].size
        pos = 0
        while pos < size:
            n = min(rnd.choice([1000, 4096, 65536]), size - pos)
            sink.write(index, pos, memoryview(data)[off + pos:off + pos + n])
            pos += n
            if rnd.random() < 0.3:
                time.sleep(0.001)
        hasher.mark(index)

    order = list(range(1, n_shards + 1))
    rnd.shuffle(order)
    with ThreadPoolExecutor(3) as ex:
        list(ex.map(write_shard, order))
    digest = hasher.finish()
    sink.close()
    assert digest == m.blake3
    assert os.path.getsize(path) == len(data)


def test_a_reset_shard_voids_the_running_hash_and_finish_rehashes(tmp_path):
    """A shard the hash has read into is reset (a bad transfer) and rewritten: the result is still the file's hash."""
    data = random.Random(9).randbytes(250_000)
    m, sink, hasher = _hashed_sink(tmp_path / "out.bin", data, 100_000)
    shards = m.shards
    sink.write(1, 0, b"\xff" * 50_000)  # wrong bytes, hashed from the buffer at once
    sink.reset(1)
    for i in (1, 2, 3):
        off = m.shard_offset(i)
        sink.write(i, 0, data[off:off + shards[i - 1].size])
        hasher.mark(i)
    assert hasher.finish() == m.blake3
    sink.close()


def test_bytes_written_where_the_hash_stands_are_hashed_from_the_buffer(tmp_path):
    """No read-back for them: the hash has moved past them when the write returns (the thread only reads back bytes
    written elsewhere, here shard 2's, once shard 1 is done)."""
    data = random.Random(10).randbytes(200_000)
    m, sink, hasher = _hashed_sink(tmp_path / "out.bin", data, 100_000)
    sink.write(2, 0, data[100_000:150_000])  # not where the hash stands: left for the thread
    assert (hasher.next, hasher.pos) == (1, 0)
    sink.write(1, 0, data[:60_000])
    assert (hasher.next, hasher.pos) == (1, 60_000)
    sink.write(1, 60_000, data[60_000:100_000])
    assert (hasher.next, hasher.pos) == (1, 100_000)
    hasher.mark(1)
    sink.write(2, 50_000, data[150_000:])
    hasher.mark(2)
    assert hasher.finish() == m.blake3
    sink.close()


def _no_room(fd: int, offset: int, length: int) -> None:
    raise OSError(28, "No space left on device")


def _unsupported(fd: int, offset: int, length: int) -> None:
    raise OSError(95, "Operation not supported")


@pytest.mark.parametrize("fallocate", [_no_room, _unsupported])
def test_the_output_is_reserved_up_front_or_extended_where_it_cannot_be(tmp_path, monkeypatch, fallocate):
    """No room for the file: the fetch fails before a shard is requested. A file system without fallocate: the
    file is extended sparse and the fetch works."""
    origin = Origin(tmp_path / "origin", shard_size=SHARD)
    url = origin.serve()
    ckpt = make_file(tmp_path / "ckpt.bin", 3 * SHARD + 5, seed=7)
    origin.publish_sync(ckpt, version=1)
    requested: list[str] = []
    real_get = RawPool.get

    async def counting_get(self, u, *a, **kw):  # noqa: ANN001, ANN202
        requested.append(u)
        return await real_get(self, u, *a, **kw)

    monkeypatch.setattr(RawPool, "get", counting_get)
    monkeypatch.setattr(dl.os, "posix_fallocate", fallocate)
    try:
        if fallocate is _no_room:
            with pytest.raises(FetchError, match=r"cannot make .*out\.bin\.part.*No space left"):
                asyncio.run(fetch_async([url], tmp_path / "out.bin", origin.public_key))
            assert not [u for u in requested if "/shard_" in u]
        else:
            res = asyncio.run(fetch_async([url], tmp_path / "out.bin", origin.public_key))
            assert same_file(res.path, ckpt)
    finally:
        origin.close()


def test_body_buffers_are_reused_across_requests_and_the_spares_stay_bounded():
    from swarmrl.shardcast.client import http_get

    body = random.Random(11).randbytes(3 * http_get.BUFFER + 999)

    async def main() -> None:
        runner, url = await _body_server(body)
        pool = RawPool()
        seen: list[object] = []  # the buffers themselves (kept alive: no id is reused)
        with ThreadPoolExecutor(1) as ex:
            for _ in range(3):
                got: list[bytes] = []

                def on_data(view: memoryview, got: list[bytes] = got):  # noqa: ANN202
                    seen.append(view.obj)
                    return ex.submit(lambda v=view: got.append(bytes(v)))

                await pool.get(url, {}, lambda resp: len(body), on_data)
                assert b"".join(got) == body
                assert len(http_get._spare) <= http_get.SPARE
        pool.close()
        await runner.cleanup()
        # two buffers per request at most, and the later requests took the first one's buffers back
        assert len({id(o) for o in seen}) <= http_get.BUFFERS

    asyncio.run(main())
