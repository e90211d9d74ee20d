"""Interop with the public SHARDCAST 0.3.x layout, URL forms users type, the upload cap and streaming relays.

The 0.3.x origin here is built by the test the way 0.3.x lays out a version (distribution.txt with the whole-file
BLAKE3 and the shard count, 1-based five-digit shard files, data1.bin) and served by Python's single-request
HTTP/1.0 file server on a real socket, as 0.3.x serves it."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from functools import partial
from http.server import HTTPServer, SimpleHTTPRequestHandler
from pathlib import Path

import blake3
import pytest
from _shardcast_util import make_file, raw_http, same_file, status_of, wait_until
from typer.testing import CliRunner

from swarmrl.shardcast import FetchError, FetchOptions, Origin, Relay, ShardServer, fetch
from swarmrl.shardcast.signing import generate_key, public_key_hex

SHARD = 50_000
SIZE = 7 * SHARD + 321


def _layout_03x(root: Path, src: Path, version: int, shard_size: int = SHARD) -> str:
    """Lay ``src`` out under ``root`` as SHARDCAST 0.3.x does; returns the whole-file checksum it lists."""
    data = src.read_bytes()
    vdir = root / f"v{version}"
    vdir.mkdir(parents=True)
    shards = [data[i:i + shard_size] for i in range(0, len(data), shard_size)]
    for i, chunk in enumerate(shards, 1):
        (vdir / f"shard_{i:05d}.bin").write_bytes(chunk)
    checksum = blake3.blake3(data).hexdigest()
    with (root / "distribution.txt").open("a") as f:
        f.write(f"v{version}: {checksum}|{len(shards)}\n")
    (root / "data1.bin").write_bytes(b"\0" * 1024)
    return checksum


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture
def origin_03x(tmp_path):
    """(url, root, source file): a 0.3.x-layout origin with v1 and v2, on HTTP/1.0 http.server."""
    root = tmp_path / "ref_origin"
    root.mkdir()
    src = make_file(tmp_path / "model.safetensors", SIZE, seed=5)
    _layout_03x(root, make_file(tmp_path / "old.bin", SHARD + 5, seed=6), 1)
    _layout_03x(root, src, 2)
    httpd = HTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", root, src
    httpd.shutdown()
    httpd.server_close()


def test_insecure_client_reads_a_03x_origin_and_warns(tmp_path, origin_03x, capsys):
    url, _, src = origin_03x
    res = fetch([url], tmp_path / "out.bin", None, options=FetchOptions(insecure=True))
    assert res.version == 2 and not res.signed and res.manifest is None
    assert same_file(res.path, src)
    assert "WARNING" in capsys.readouterr().err
    res = fetch([url + "/"], tmp_path / "v1.bin", None, version=1, options=FetchOptions(insecure=True))
    assert res.version == 1 and res.size == SHARD + 5


def test_03x_origin_refused_without_insecure(tmp_path, origin_03x):
    url, _, _ = origin_03x
    pub = public_key_hex(generate_key())
    with pytest.raises(FetchError, match="no server offers"):
        fetch([url], tmp_path / "out.bin", pub)
    with pytest.raises(ValueError, match="origin public key is required"):
        fetch([url], tmp_path / "out.bin", None)
    # a key, but nothing signed: falls back loudly
    res = fetch([url], tmp_path / "out.bin", pub, options=FetchOptions(insecure=True))
    assert res.version == 2 and not res.signed


def test_03x_checksum_mismatch_and_bad_layouts_rejected(tmp_path, origin_03x):
    url, root, _ = origin_03x
    shard = root / "v2" / "shard_00003.bin"
    data = bytearray(shard.read_bytes())
    data[10] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(FetchError, match="whole-file BLAKE3"):
        fetch([url], tmp_path / "out.bin", None, options=FetchOptions(insecure=True))
    assert not (tmp_path / "out.bin").exists()
    shard.write_bytes(bytes(data[:100]))  # a short middle shard: not one file cut in equal shards
    with pytest.raises(FetchError, match="shard sizes"):
        fetch([url], tmp_path / "out.bin", None, options=FetchOptions(insecure=True))
    (root / "v2" / "shard_00007.bin").unlink()  # listed but missing: bounded retries, then a clear error
    with pytest.raises(FetchError, match="shard 7 of v2"):
        fetch([url], tmp_path / "out.bin", None, options=FetchOptions(insecure=True, max_attempts=2))
    assert not list(tmp_path.glob(".out.bin*"))


def test_url_forms_bare_host_port_and_double_slashes(tmp_path):
    src = make_file(tmp_path / "m.bin", SIZE, seed=2)
    o = Origin(tmp_path / "o", shard_size=SHARD)
    o.publish_sync(src, version=3)
    url = o.serve()
    try:
        hostport = url.removeprefix("http://")
        for i, form in enumerate([hostport, url + "/", url + "//", f"{hostport}//"]):
            res = fetch([form], tmp_path / f"o{i}.bin", o.public_key)
            assert res.version == 3 and same_file(res.path, src), form
        port = int(hostport.rsplit(":", 1)[1])
        # a client that joins "http://host/" and "/v3/..." (as 0.3.x does with a trailing slash) is served
        for path in (b"//v3/shard_00001.bin", b"/v3//shard_00001.bin", b"//distribution.txt"):
            resp = raw_http(port, b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert status_of(resp) == 200, path
        for bad in ("https://" + hostport, "ftp://x", "http://u@h:1", hostport + "?x=1"):
            with pytest.raises(ValueError):
                fetch([bad], tmp_path / "x.bin", o.public_key)
    finally:
        o.close()


def test_cli_insecure_fetch_of_a_03x_origin(tmp_path, origin_03x):
    from swarmrl.cli import app

    url, _, src = origin_03x
    out = tmp_path / "cli.bin"
    r = CliRunner().invoke(app, ["shardcast", "fetch", "--server", url.removeprefix("http://") + "//", "--out",
                                 str(out), "--insecure"])
    assert r.exit_code == 0, r.output
    assert "WARNING" in r.output and "UNSIGNED" in " ".join(r.output.split())
    assert same_file(out, src)
    r = CliRunner().invoke(app, ["shardcast", "fetch", "--server", url, "--out", str(out)])
    assert r.exit_code == 2 and "origin_pubkey is required" in " ".join(r.output.split())


def test_upload_cap_bounds_all_downloads_together(tmp_path):
    """Two concurrent downloads from a server capped at 4 Mb/s (500 kB/s) share that rate: together they cannot
    finish before (size - one chunk)/rate (a chunk leaves at the start of its slot; a lower bound only: a loaded
    machine may be slower)."""
    src = make_file(tmp_path / "m.bin", 4 * SHARD, seed=3)
    o = Origin(tmp_path / "o", shard_size=SHARD)
    o.publish_sync(src, version=1)

    async def main():
        srv = ShardServer(o.root, max_upload_mbps=4.0)
        await srv.start()
        try:
            from swarmrl.shardcast import fetch_async

            t = time.perf_counter()
            a, b = await asyncio.gather(fetch_async([srv.url], tmp_path / "a.bin", o.public_key),
                                        fetch_async([srv.url], tmp_path / "b.bin", o.public_key))
            elapsed = time.perf_counter() - t
        finally:
            await srv.stop()
        assert same_file(a.path, src) and same_file(b.path, src)
        assert elapsed >= 0.95 * (2 * 4 * SHARD - SHARD) / 500_000, elapsed

    asyncio.run(main())
    o.close()


def test_relay_streams_a_shard_onward_while_it_arrives(tmp_path):
    """One big shard from a slow origin: a reader of the relay gets its first bytes before the relay holds the
    whole shard, then the whole shard, equal to the origin's."""
    src = make_file(tmp_path / "m.bin", 400_000, seed=4)
    o = Origin(tmp_path / "o", shard_size=1_000_000)  # one shard
    o.publish_sync(src, version=1)

    async def main():
        slow = ShardServer(o.root, rate_limit_bps=400_000)  # ~1 s for the shard
        await slow.start()
        relay = Relay(tmp_path / "r", [slow.url], o.public_key)
        url = await relay.start()
        try:
            final = tmp_path / "r" / "v1" / "shard_00001.bin"
            await wait_until(lambda: 1 in relay.server.partial)  # the relay holds the verified manifest
            reader, writer = await asyncio.open_connection("127.0.0.1", relay.server.port)
            writer.write(b"GET /v1/shard_00001.bin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            assert head.startswith(b"HTTP/1.1 200") and b"Content-Length: 400000" in head
            first = await asyncio.wait_for(reader.readexactly(16384), 30)
            assert not final.exists()  # streamed before the relay verified and placed the shard
            rest = await asyncio.wait_for(reader.read(), 30)
            writer.close()
            assert first + rest == src.read_bytes()
            res = await __import__("swarmrl.shardcast", fromlist=["fetch_async"]).fetch_async(
                [url], tmp_path / "c.bin", o.public_key, options=FetchOptions(wait_s=10))
            assert same_file(res.path, src)
        finally:
            await relay.stop()
            await slow.stop()

    asyncio.run(main())
    o.close()


def test_reference_client_reads_our_origin(tmp_path):
    """The reverse direction: the reference SHARDCAST 0.3.x client (when installed) reads our origin."""
    ref = pytest.importorskip("shardcast.client_node")
    if shutil.which("wget") is None:
        pytest.skip("the reference client needs wget")
    src = make_file(tmp_path / "m.bin", SIZE, seed=7)
    o = Origin(tmp_path / "o", shard_size=SHARD)
    o.publish_sync(src, version=1)
    url = o.serve()
    try:
        node = ref.ClientNode([url + "/"], output_dir=str(tmp_path / "dl"))
        got = node.download_version("v1", str(tmp_path / "ref.bin"))
        assert got is not None and same_file(Path(got), src)
    finally:
        o.close()
