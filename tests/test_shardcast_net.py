"""SHARDCAST on loopback: real aiohttp servers on 127.0.0.1 ephemeral ports, real processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from _shardcast_util import flip_byte, make_file, raw_http, same_file, status_of, wait_until
from aiohttp import web

from swarmrl.shardcast import FetchError, FetchOptions, Origin, Relay, ShardServer, fetch, fetch_async
from swarmrl.shardcast.client.options import RELAY_UPSTREAM
from swarmrl.shardcast.layout import MANIFEST_NAME, Manifest, ShardInfo, atomic_write, shard_name
from swarmrl.shardcast.server.shard_server import Serving
from swarmrl.shardcast.signing import generate_key, sign_manifest, verify_manifest

SHARD = 64 * 1024
SIZE = 20 * SHARD + 1234  # 21 shards, last one short
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def origin(tmp_path):
    o = Origin(tmp_path / "origin", keep=3, shard_size=SHARD)
    o.serve()
    yield o
    o.close()


@pytest.fixture
def ckpt(tmp_path):
    return make_file(tmp_path / "model.safetensors", SIZE, seed=1)


def test_origin_to_two_relays_to_clients(tmp_path, origin, ckpt):
    """origin -> relay A, relay B (B also chained under A) -> 4 concurrent clients, all verified."""
    async def main():
        ra = Relay(tmp_path / "ra", [origin.url], origin.public_key, metrics=tmp_path / "ra.jsonl")
        rb = Relay(tmp_path / "rb", [ra_url := await ra.start(), origin.url], origin.public_key)
        rb_url = await rb.start()
        origin.publish(ckpt, version=100)
        outs = [tmp_path / f"out{i}.bin" for i in range(4)]
        results = await asyncio.gather(*(fetch_async([ra_url, rb_url], o, origin.public_key, version=100,
                                                     options=FetchOptions(wait_s=20, parallel=4)) for o in outs))
        await wait_until(lambda: ra.synced == [100] and rb.synced == [100])
        for r, o in zip(results, outs):
            assert r.version == 100 and same_file(o, ckpt)
            assert r.excluded == {}
            assert not list(tmp_path.glob(f".{o.name}.part*"))  # temp files renamed / removed
        served = {u: sum(r.bytes_by_server[u] for r in results) for u in (ra_url, rb_url)}
        assert sum(served.values()) == 4 * SIZE and all(v > 0 for v in served.values())
        # both relays expose the public layout, byte-identical to the origin
        for d in ("ra", "rb"):
            assert (tmp_path / d / "distribution.txt").read_text() == \
                (tmp_path / "origin" / "distribution.txt").read_text()
            assert (tmp_path / d / "v100" / shard_name(21)).read_bytes() == \
                (tmp_path / "origin" / "v100" / shard_name(21)).read_bytes()
        await rb.stop()
        await ra.stop()
        from swarmrl.utils.metrics import read_metrics

        (row,) = read_metrics(tmp_path / "ra.jsonl")
        assert row["event"] == "relay_synced" and row["version"] == 100 and row["bytes_fetched"] == SIZE

    asyncio.run(main())


def test_relay_pipelines_shards_while_still_receiving(tmp_path, ckpt):
    """A client reads shard 1 from a relay that is still receiving later shards (slow origin)."""
    o = Origin(tmp_path / "origin", shard_size=SHARD)
    srv_holder = {}

    async def main():
        srv = ShardServer(o.root, rate_limit_bps=2_000_000)  # slow origin link: ~0.7 s for the file
        await srv.start()
        srv_holder["s"] = srv
        o.publish_sync(ckpt, version=1)
        srv.refresh()
        relay = Relay(tmp_path / "r", [srv.url], o.public_key, upstream_options=replace(RELAY_UPSTREAM, parallel=2))
        url = await relay.start()
        seen = []

        def on_shard(done, total):
            part = relay.server.partial.get(1)
            seen.append(len(part.have) if part else total)

        res = await fetch_async([url], tmp_path / "out.bin", o.public_key, on_shard=on_shard,
                                options=FetchOptions(wait_s=20, parallel=4))
        assert same_file(res.path, ckpt)
        # when the client finished its first shard, the relay did not yet hold all 21
        assert seen[0] < 21
        await relay.stop()
        await srv.stop()

    asyncio.run(main())
    o.close()


RELAY_PROC = r"""
import asyncio, sys
from swarmrl.shardcast import Relay
from swarmrl.shardcast.server.shard_server import Serving
async def main():
    r = Relay(sys.argv[1], [sys.argv[2]], sys.argv[3], serving=Serving(rate_limit_bps=float(sys.argv[4])))
    url = await r.start()
    print(url, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


def _spawn_relay(d, upstream, pub, rate):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-c", RELAY_PROC, str(d), upstream, pub, str(rate)],
                         stdout=subprocess.PIPE, text=True, env=env)
    url = p.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), url
    return p, url


def test_relay_killed_mid_transfer_clients_finish_from_others(tmp_path, origin, ckpt):
    origin.publish_sync(ckpt, version=5)
    procs = [_spawn_relay(tmp_path / f"r{i}", origin.url, origin.public_key, 1_500_000) for i in range(2)]
    (pa, ua), (pb, ub) = procs
    try:
        killed = threading.Event()

        def on_shard(done, total):
            if done == 3 and not killed.is_set():
                pa.send_signal(signal.SIGKILL)  # relay A dies while serving its in-flight shards
                killed.set()

        res = fetch([ua, ub], tmp_path / "out.bin", origin.public_key, version=5, on_shard=on_shard,
                    options=FetchOptions(wait_s=30, parallel=4))
        assert killed.is_set() and pa.wait(10) == -signal.SIGKILL
        assert same_file(res.path, ckpt)
        assert res.bytes_by_server[ub] > 0
        assert res.bytes_by_server[ua] < SIZE
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)


def test_corrupt_relay_shard_caught_refetched_and_relay_excluded(tmp_path, origin, ckpt):
    origin.publish_sync(ckpt, version=2)

    async def main():
        bad = Relay(tmp_path / "bad", [origin.url], origin.public_key)
        bad_url = await bad.start()
        await wait_until(lambda: bad.synced == [2])
        for i in range(1, 22):  # the relay's disk (or the relay itself) now serves altered bytes
            flip_byte(tmp_path / "bad" / "v2" / shard_name(i), at=100)
        res = await fetch_async([bad_url, origin.url], tmp_path / "out.bin", origin.public_key,
                                options=FetchOptions(parallel=2))
        assert same_file(res.path, ckpt)
        assert "corrupt shard" in res.excluded[bad_url]
        assert origin.url not in res.excluded
        # a downstream relay fed by the bad relay and the origin also ends up with good data only
        down = Relay(tmp_path / "down", [bad_url, origin.url], origin.public_key,
                     upstream_options=replace(RELAY_UPSTREAM, parallel=2))
        await down.start()
        await wait_until(lambda: down.synced == [2])
        for i in range(1, 22):
            assert (tmp_path / "down" / "v2" / shard_name(i)).read_bytes() == \
                (tmp_path / "origin" / "v2" / shard_name(i)).read_bytes()
        assert "corrupt" in (down.pool.servers[bad_url].reason or "")
        # with only the bad server the client gives up with a clear, bounded error
        with pytest.raises(FetchError, match="corrupt"):
            await fetch_async([bad_url], tmp_path / "out2.bin", origin.public_key, options=FetchOptions(max_attempts=3))
        assert not (tmp_path / "out2.bin").exists()
        await down.stop()
        await bad.stop()

    asyncio.run(main())


def _evil_copy(tmp_path, origin, version) -> Path:
    """A server directory where an attacker replaced shard 1 and re-signed the manifest."""
    import shutil

    evil = tmp_path / "evil"
    shutil.copytree(origin.root, evil)
    vdir = evil / f"v{version}"
    m = verify_manifest((vdir / MANIFEST_NAME).read_bytes(), origin.public_key)
    import blake3

    data = b"\0" * m.shards[0].size
    (vdir / shard_name(1)).write_bytes(data)
    shards = (ShardInfo(len(data), blake3.blake3(data).hexdigest()),) + m.shards[1:]
    forged = Manifest(m.version, m.size, m.shard_size, m.blake3, shards, m.filename, m.created)
    atomic_write(vdir / MANIFEST_NAME, sign_manifest(forged, generate_key()))
    return evil


def test_forged_manifest_rejected(tmp_path, origin, ckpt):
    origin.publish_sync(ckpt, version=9)
    evil_dir = _evil_copy(tmp_path, origin, 9)

    async def main():
        evil = ShardServer(evil_dir)
        await evil.start()
        with pytest.raises(FetchError, match="signature"):
            await fetch_async([evil.url], tmp_path / "x.bin", origin.public_key)
        res = await fetch_async([evil.url, origin.url], tmp_path / "y.bin", origin.public_key)
        assert same_file(res.path, ckpt)
        if evil.url in res.excluded:  # its forged manifest or its altered shard 1 was tried
            assert "invalid manifest" in res.excluded[evil.url] or "corrupt shard 1 " in res.excluded[evil.url]
        # a relay whose only upstream forges never announces the version
        relay = Relay(tmp_path / "r", [evil.url], origin.public_key)
        url = await relay.start()
        await asyncio.sleep(1.0)
        assert relay.synced == [] and 9 not in relay.server.partial
        assert not (tmp_path / "r" / "v9" / MANIFEST_NAME).exists()
        with pytest.raises(FetchError):
            await fetch_async([url], tmp_path / "z.bin", origin.public_key)
        await relay.stop()
        await evil.stop()

    asyncio.run(main())


def test_path_traversal_and_oversized_requests_refused(tmp_path, origin, ckpt):
    origin.publish_sync(ckpt, version=1)
    (tmp_path / "secret.txt").write_text("top secret")
    (origin.root / "origin_state.json").exists()
    port = int(origin.url.rsplit(":", 1)[1])
    ok = raw_http(port, b"GET /v1/shard_00001.bin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(ok) == 200
    for path in [b"/../secret.txt", b"/v1/../../secret.txt", b"/v1/..%2f..%2fsecret.txt",
                 b"/%2e%2e/secret.txt", b"/v1/shard_00001.bin/../../../secret.txt", b"/origin_state.json",
                 b"/v1/manifest.json/..", b"//etc/passwd", b"/v1\\..\\..\\secret.txt", b"/v0/shard_00001.bin",
                 b"/v1/shard_1.bin", b"/.lock"]:
        resp = raw_http(port, b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert status_of(resp) in (400, 404), (path, resp[:80])
        assert b"top secret" not in resp
    for q in (b"wait=nan", b"since=abc", b"wait=1e999"):
        resp = raw_http(port, b"GET /versions.json?" + q + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert status_of(resp) in (200, 400), q  # answered at once, never hangs or crashes
    long_url = b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    assert status_of(raw_http(port, long_url)) in (400, 414, 431)
    big_header = b"GET /distribution.txt HTTP/1.1\r\nHost: x\r\nX-Junk: " + b"b" * 20000 + b"\r\n\r\n"
    assert status_of(raw_http(port, big_header)) in (400, 431)
    many = b"GET /distribution.txt HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n"
    assert status_of(raw_http(port, many)) in (400, 431)
    post = b"POST /distribution.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
    assert status_of(raw_http(port, post)) == 405
    body = b"GET /distribution.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\nConnection: close\r\n\r\nxx"
    assert status_of(raw_http(port, body)) == 413
    bad_range = b"GET /v1/shard_00001.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=999999999-\r\nConnection: close\r\n\r\n"
    assert status_of(raw_http(port, bad_range)) == 416
    rng = raw_http(port, b"GET /v1/shard_00002.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=10-19\r\nConnection: close\r\n\r\n")
    assert status_of(rng) == 206
    assert rng.split(b"\r\n\r\n", 1)[1] == (origin.root / "v1" / shard_name(2)).read_bytes()[10:20]


def test_origin_retention_and_restart_never_reuses_versions(tmp_path, ckpt):
    o = Origin(tmp_path / "o", keep=2, shard_size=SHARD)
    for v in (10, 20, 30):
        o.publish(ckpt, version=v)
    o.publish_sync(ckpt)  # default: last + 1
    assert o.versions() == [30, 31]
    assert sorted(p.name for p in o.root.glob("v*")) == ["v30", "v31"]
    with pytest.raises(ValueError, match="never reused"):
        o.publish(ckpt, version=31)
    o.close()
    o2 = Origin(tmp_path / "o", keep=2, shard_size=SHARD)  # restart (same key file, same dir)
    assert o2.public_key == o.public_key and o2.last_version == 31
    for v in (1, 20, 31):
        with pytest.raises(ValueError):
            o2.publish(ckpt, version=v)
    assert o2.publish_sync(ckpt).version == 32
    # a reservation survives a crash before the version was listed
    o2.publish(ckpt, version=50).result()
    (o2.root / "distribution.txt").write_text("")
    import shutil

    shutil.rmtree(o2.root / "v50")
    o2.close()
    o3 = Origin(tmp_path / "o", keep=2, shard_size=SHARD)
    assert o3.last_version == 50
    with pytest.raises(ValueError):
        o3.publish(ckpt, version=50)
    o3.close()


def test_relay_retention_and_restart_keeps_shards(tmp_path, origin, ckpt):
    async def main():
        relay = Relay(tmp_path / "r", [origin.url], origin.public_key, keep=2)
        await relay.start()
        for v in (1, 2, 3):
            origin.publish_sync(ckpt, version=v)
            await wait_until(lambda: v in relay.synced)
        await wait_until(lambda: sorted(p.name for p in (tmp_path / "r").glob("v*")) == ["v2", "v3"])
        assert "v1:" not in (tmp_path / "r" / "distribution.txt").read_text()
        await relay.stop()
        origin.close()  # upstream gone: a restarted relay must serve from its own disk
        relay2 = Relay(tmp_path / "r", [origin.url or "http://127.0.0.1:9"], origin.public_key, keep=2)
        url = await relay2.start()
        res = await fetch_async([url], tmp_path / "out.bin", origin.public_key)
        assert res.version == 3 and same_file(res.path, ckpt)
        await relay2.stop()

    asyncio.run(main())


def test_restarted_relay_resumes_partial_version(tmp_path, ckpt):
    o = Origin(tmp_path / "o", shard_size=SHARD)
    o.publish_sync(ckpt, version=4)

    async def main():
        slow = ShardServer(o.root, rate_limit_bps=1_000_000)
        await slow.start()
        relay = Relay(tmp_path / "r", [slow.url], o.public_key, upstream_options=replace(RELAY_UPSTREAM, parallel=1))
        await relay.start()
        await wait_until(lambda: 4 in relay.server.partial and len(relay.server.partial[4].have) >= 5)
        await relay.stop()  # interrupted mid-version
        have = sorted(p.name for p in (tmp_path / "r" / "v4").glob("shard_*.bin"))
        assert 5 <= len(have) < 21
        fast = ShardServer(o.root)
        await fast.start()
        relay2 = Relay(tmp_path / "r", [fast.url], o.public_key)
        await relay2.start()
        assert len(relay2.server.partial[4].have) == len(have)  # kept and re-verified on start
        await wait_until(lambda: relay2.synced == [4])
        fetched = relay2.pool.servers[fast.url].bytes
        assert fetched <= SIZE - len(have) * SHARD  # did not download kept shards again
        res = await fetch_async([relay2.url], tmp_path / "out.bin", o.public_key)
        assert same_file(res.path, ckpt)
        await relay2.stop()
        await fast.stop()
        await slow.stop()

    asyncio.run(main())
    o.close()


def test_client_resumes_interrupted_shard_with_range(tmp_path, origin, ckpt):
    """A server that drops every non-Range shard response halfway: the client resumes with Range."""
    origin.publish_sync(ckpt, version=7)
    ranges = []

    async def flaky_shard(request):
        path = origin.root / "v7" / request.match_info["name"]
        if "Range" in request.headers:
            ranges.append(request.headers["Range"])
            return web.FileResponse(path)
        data = path.read_bytes()
        resp = web.StreamResponse()
        resp.content_length = len(data)
        await resp.prepare(request)
        await resp.write(data[: len(data) // 2])
        await asyncio.sleep(0.05)
        request.transport.close()  # connection dies mid-shard
        return resp

    async def main():
        async def versions(request):
            return web.json_response({"seq": 1, "complete": [7], "partial": {}})

        async def manifest(request):
            return web.FileResponse(origin.root / "v7" / MANIFEST_NAME)

        app = web.Application()
        app.router.add_get("/versions.json", versions)
        app.router.add_get("/v7/manifest.json", manifest)
        app.router.add_get("/v7/{name}", flaky_shard)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        res = await fetch_async([url], tmp_path / "out.bin", origin.public_key,
                                options=FetchOptions(parallel=2, max_server_failures=100))
        assert same_file(res.path, ckpt)
        assert len(ranges) == 21 and all(r.startswith("bytes=") and not r.startswith("bytes=0-") for r in ranges)
        await runner.cleanup()

    asyncio.run(main())


def test_static_file_server_interop_and_unreachable_error(tmp_path, origin, ckpt):
    """Any static server (here Python's http.server) holding the layout can serve our clients."""
    origin.publish_sync(ckpt, version=3)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(origin.root)))
    httpd.RequestHandlerClass.log_message = lambda *a: None
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        res = fetch([url], tmp_path / "out.bin", origin.public_key)
        assert res.version == 3 and same_file(res.path, ckpt)
        with pytest.raises(FetchError, match="no server offers v4"):
            fetch([url], tmp_path / "out4.bin", origin.public_key, version=4)
        with pytest.raises(FetchError, match="no server offers"):
            fetch(["http://127.0.0.1:9"], tmp_path / "o.bin", origin.public_key)
    finally:
        httpd.shutdown()


def test_origin_dir_served_by_separate_server_long_poll_sees_publish(tmp_path, ckpt):
    """The trainer publishes with the API (no server); a separate server process on the same
    directory (here: a ShardServer instance) wakes its long-poll readers when the version lands."""
    o = Origin(tmp_path / "o", shard_size=SHARD)

    async def main():
        srv = ShardServer(o.root, watch_s=0.05)
        await srv.start()
        import aiohttp

        async with aiohttp.ClientSession() as s:
            async with s.get(f"{srv.url}/versions.json") as r:
                first = await r.json()
            assert first["complete"] == []
            poll = asyncio.create_task(s.get(f"{srv.url}/versions.json?since={first['seq']}&wait=30"))
            await asyncio.sleep(0.2)
            assert not poll.done()  # held open: nothing new yet
            await asyncio.to_thread(o.publish_sync, ckpt, 77)
            r = await asyncio.wait_for(poll, 10)
            assert (await r.json())["complete"] == [77]
        await srv.stop()

    asyncio.run(main())
    o.close()


def test_interrupted_fetch_resumes_verified_shards_next_run(tmp_path, origin, ckpt):
    origin.publish_sync(ckpt, version=6)

    class Stop(Exception):
        pass

    def boom(done, total):
        if done >= 5:
            raise Stop

    out = tmp_path / "out.bin"
    with pytest.raises(Stop):
        fetch([origin.url], out, origin.public_key, on_shard=boom, options=FetchOptions(parallel=2))
    assert not out.exists() and (tmp_path / ".out.bin.part").exists()
    flip_byte(tmp_path / ".out.bin.part", at=0)  # damage in the temp file is caught: shard 1 re-fetched
    res = fetch([origin.url], out, origin.public_key, options=FetchOptions(parallel=2))
    assert 4 <= res.resumed_shards < 21
    assert same_file(out, ckpt)
    assert not (tmp_path / ".out.bin.part").exists() and not (tmp_path / ".out.bin.part.json").exists()


def test_client_prefers_the_faster_server(tmp_path, origin, ckpt):
    """Throughput-aware choice: after probing, shards go to the server that measured faster."""
    origin.publish_sync(ckpt, version=8)

    async def main():
        slow = ShardServer(origin.root, rate_limit_bps=400_000)
        await slow.start()
        res = await fetch_async([slow.url, origin.url], tmp_path / "out.bin", origin.public_key,
                                options=FetchOptions(parallel=4))
        assert same_file(res.path, ckpt)
        assert res.bytes_by_server[slow.url] <= 4 * SHARD < res.bytes_by_server[origin.url]
        await slow.stop()

    asyncio.run(main())


def test_not_yet_arrived_shards_do_not_burn_retries(tmp_path, ckpt):
    """A relay whose hold expires (503, shard still on its way) is waited on, not counted as failing."""
    o = Origin(tmp_path / "o", shard_size=SHARD)
    o.publish_sync(ckpt, version=1)

    async def main():
        slow = ShardServer(o.root, rate_limit_bps=1_000_000)
        await slow.start()
        relay = Relay(tmp_path / "r", [slow.url], o.public_key, upstream_options=replace(RELAY_UPSTREAM, parallel=1),
                      serving=Serving(hold_s=0.1))
        url = await relay.start()
        res = await fetch_async([url], tmp_path / "out.bin", o.public_key,
                                options=FetchOptions(wait_s=20, parallel=8, max_attempts=2))
        assert same_file(res.path, ckpt) and not res.excluded
        await relay.stop()
        await slow.stop()

    asyncio.run(main())
    o.close()


def test_publish_move_takes_the_file_and_returns_before_sharding(tmp_path):
    o = Origin(tmp_path / "o", shard_size=SHARD)
    src = make_file(tmp_path / "step_5.safetensors", SIZE, seed=5)
    copy = tmp_path / "copy.bin"
    copy.write_bytes(src.read_bytes())
    fut = o.publish(src, version=5, move=True)
    assert not src.exists()  # renamed into the origin dir at once; the trainer may reuse the name
    res = fut.result()
    assert res.manifest.filename == "step_5.safetensors" and o.versions() == [5]
    assert not list(o.root.glob(".incoming_*"))
    out = tmp_path / "out.bin"
    url = o.serve()
    fetch([url], out, o.public_key)
    assert same_file(out, copy)
    o.close()
