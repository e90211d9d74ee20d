"""A SHARDCAST server that stalls (answers a shard with a few bytes, then nothing), trickles (a byte now and then,
just often enough to beat a socket read timeout) or never answers must not hold a download hostage: it misses
the progress deadline, is dropped for that shard and the shard is finished from a good server (resumed by
Range). Real servers on 127.0.0.1; the deadlines are shortened for the test and nothing is timed: the
assertions are on who served the bytes and why the bad server was dropped."""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace
from pathlib import Path

import pytest
from _shardcast_util import make_file, same_file
from aiohttp import web

from swarmrl.shardcast import FetchError, FetchOptions, Origin, fetch_async
from swarmrl.shardcast.layout import MANIFEST_NAME, shard_name

SHARD = 64 * 1024
SIZE = 6 * SHARD + 99


@pytest.fixture
def origin(tmp_path):
    o = Origin(tmp_path / "origin", keep=3, shard_size=SHARD)
    o.serve()
    yield o
    o.close()


# progress deadline of 1 s without a byte, minimum rate over a 1 s window (defaults: 10 s)
QUICK = FetchOptions(stall_s=1.0, window_s=1.0)


class Hostile:
    """Offers every version of ``root`` like a relay, but misbehaves on shards (``mode``)."""

    def __init__(self, root: Path, mode: str) -> None:
        self.root, self.mode = root, mode
        self.shard_requests = 0
        self.runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/versions.json":
            vs = sorted(int(p.name[1:]) for p in self.root.glob("v*") if (p / MANIFEST_NAME).is_file())
            return web.json_response({"seq": 1, "complete": vs, "partial": {}})
        m = re.fullmatch(r"/v(\d+)/manifest\.json", request.path)
        if m:
            return web.FileResponse(self.root / f"v{m.group(1)}" / MANIFEST_NAME)
        m = re.fullmatch(r"/v(\d+)/shard_(\d+)\.bin", request.path)
        if not m:
            raise web.HTTPNotFound()
        self.shard_requests += 1
        data = (self.root / f"v{m.group(1)}" / shard_name(int(m.group(2)))).read_bytes()
        if self.mode == "silent":  # accepts the request, never answers
            await asyncio.sleep(3600)
        resp = web.StreamResponse(status=200)
        resp.content_length = len(data)
        await resp.prepare(request)
        await resp.write(data[:10])
        if self.mode == "stall":  # a few bytes, then nothing
            await asyncio.sleep(3600)
        for i in range(10, len(data)):  # "trickle": a byte every 0.2 s, forever under any socket read timeout
            await resp.write(data[i: i + 1])
            await asyncio.sleep(0.2)
        return resp

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        await self.runner.cleanup()


REASONS = {"stall": "no bytes for 1 s (after 10 bytes)", "trickle": "under the minimum",
           "silent": "no response within 1 s"}


@pytest.mark.parametrize("mode", ["stall", "trickle", "silent"])
def test_a_stalling_server_is_dropped_and_the_good_one_finishes(tmp_path, origin, mode):
    ckpt = make_file(tmp_path / "model.safetensors", SIZE, seed=3)
    origin.publish_sync(ckpt, version=4)
    options = replace(QUICK, parallel=3, **({"read_timeout": 1.0} if mode == "silent" else {}))

    async def main():
        bad = Hostile(origin.root, mode)
        bad_url = await bad.start()
        try:
            res = await fetch_async([bad_url, origin.url], tmp_path / "out.bin", origin.public_key, version=4,
                                    options=options)
        finally:
            await bad.stop()
        return bad, bad_url, res

    bad, bad_url, res = asyncio.run(main())
    assert same_file(res.path, ckpt)
    assert bad.shard_requests >= 1  # it was given a shard (unmeasured servers are probed first)
    # no shard completed from the bad server; the good one served the rest of each (the bad one's first bytes of a
    # shard are kept and resumed by Range)
    assert res.bytes_by_server[bad_url] == 0
    assert SIZE - 100 * bad.shard_requests <= res.bytes_by_server[origin.url] <= SIZE
    why = res.excluded.get(bad_url, "")
    assert why.startswith("stalled on shard ") and REASONS[mode] in why, res.excluded
    assert origin.url not in res.excluded


def test_a_lone_stalling_server_gets_its_failures_then_a_clear_error(tmp_path, origin):
    """With no other server to fail over to, a stall counts as a failure (not an instant exclusion), and the fetch
    ends with an error that says what happened instead of hanging."""
    ckpt = make_file(tmp_path / "model.safetensors", 2 * SHARD, seed=4)
    origin.publish_sync(ckpt, version=5)

    async def main():
        bad = Hostile(origin.root, "stall")
        bad_url = await bad.start()
        try:
            with pytest.raises(FetchError) as e:
                await fetch_async([bad_url], tmp_path / "out.bin", origin.public_key, version=5,
                                  options=replace(QUICK, parallel=1, max_attempts=3, max_server_failures=2))
        finally:
            await bad.stop()
        return bad, str(e.value)

    bad, msg = asyncio.run(main())
    assert bad.shard_requests == 2 and "stalled on shard 1 of v5: no bytes for 1 s" in msg, msg
