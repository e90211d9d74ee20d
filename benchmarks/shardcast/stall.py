"""A SHARDCAST server that stalls, timed: how long one fetch takes when one of its two servers misbehaves on
shards, and what the client says about it. The figures of docs/security.md ("SHARDCAST: one server sends 10 bytes
then stalls") come from this command.

    python benchmarks/shardcast/stall.py [--code DIR] [--modes stall,drip] [--cap-s 150]

A good origin (the code under test, its own process) publishes a small checkpoint (3 shards of 1 MB); a hostile
server in this process offers the same versions (it relays every request but shards from the origin) and on a
shard request either

* ``stall``: answers the headers and the shard's first 10 bytes, then sends nothing, or
* ``drip``: sends its status line and then one byte of a header every 0.5 s, forever (never finishing the head:
  under any socket read timeout).

The fetch (``swarmrl.shardcast.fetch`` with its defaults, servers ``[hostile, origin]``, the code under test, its
own process) is timed around the call; it prints one JSON line per mode: ``seconds`` (``null`` with
``"capped": true`` if it was still running at ``--cap-s`` and was killed), ``excluded`` (the client's reasons),
``bytes_by_server``. ``--code DIR`` runs another checkout's client and origin (e.g. one before the progress
deadline), the hostile server stays this file's. Loopback only; every process ends with the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench import REPO, SERVE_ORIGIN, _env, kill, publish, spawn  # noqa: E402

SHARD = re.compile(rb"^GET /v\d+/shard_\d+\.bin")
FETCH = r"""
import json, sys, time
from swarmrl.shardcast import fetch
t = time.perf_counter()
res = fetch(sys.argv[1].split(","), sys.argv[2], sys.argv[3], version=1)
print(json.dumps({"seconds": round(time.perf_counter() - t, 2), "size": res.size, "excluded": res.excluded,
                  "bytes_by_server": getattr(res, "bytes_by_server", None)}), flush=True)
"""


class Hostile:
    """The misbehaving server: shards per ``mode``, everything else fetched from ``upstream`` and relayed."""

    def __init__(self, upstream: str, mode: str) -> None:
        self.upstream, self.mode = upstream, mode
        self.loop = asyncio.new_event_loop()
        self.url = ""
        self.shard_requests = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self.thread.start()
        if not ready.wait(10):
            raise RuntimeError("hostile server did not start")

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        ready.set()
        self.loop.run_forever()
        self.loop.close()

    async def _shutdown(self) -> None:
        self.server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if SHARD.match(head):
                self.shard_requests += 1
                await (self._stall if self.mode == "stall" else self._drip)(head, writer)
            else:
                await self._relay(head, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, urllib.error.URLError,
                asyncio.CancelledError):  # cancelled: the run is over (ends quietly)
            pass
        finally:
            writer.close()

    async def _relay(self, head: bytes, writer: asyncio.StreamWriter) -> None:
        path = head.split(b" ", 2)[1].decode()

        def get() -> tuple[int, bytes, str]:
            try:
                with urllib.request.urlopen(self.upstream + path, timeout=60) as r:
                    return r.status, r.read(), r.headers.get("content-type", "application/octet-stream")
            except urllib.error.HTTPError as e:
                return e.code, e.read(), "text/plain"

        status, body, ctype = await asyncio.get_running_loop().run_in_executor(None, get)
        writer.write(b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                     % (status, ctype.encode(), len(body), body))
        await writer.drain()

    async def _stall(self, head: bytes, writer: asyncio.StreamWriter) -> None:
        path = head.split(b" ", 2)[1].decode()
        with urllib.request.urlopen(self.upstream + path, timeout=60) as r:
            first, size = r.read(10), int(r.headers["content-length"])
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: %d\r\n\r\n%s"
                     % (size, first))
        await writer.drain()
        await asyncio.sleep(3600)

    async def _drip(self, head: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nx-drip: ")
        while True:
            await writer.drain()
            await asyncio.sleep(0.5)
            writer.write(b"a")

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def run(code: Path, mode: str, cap_s: float, base: Path) -> dict:
    root, pub, _ = publish(code, base, f"stall_{mode}", 2 * 1_000_000 + 17, 1.0)
    procs: list[subprocess.Popen[str]] = []
    p, origin_url = spawn(code, SERVE_ORIGIN, root, 0)
    procs.append(p)
    bad = Hostile(origin_url, mode)
    out = base / f"{mode}.bin"
    t0 = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-P", "-c", FETCH, f"{bad.url},{origin_url}", str(out), pub],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(code))
    try:
        stdout, stderr = child.communicate(timeout=cap_s)
        res: dict = json.loads(stdout.strip().splitlines()[-1]) if child.returncode == 0 else {
            "seconds": None, "error": stderr[-300:]}
        res["capped"] = False
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        res = {"seconds": None, "capped": True, "wall_s": round(time.perf_counter() - t0, 1)}
    finally:
        bad.close()
        kill(procs)
        shutil.rmtree(root, ignore_errors=True)
        out.unlink(missing_ok=True)
    res.update(mode=mode, code=str(code), hostile=bad.url, origin=origin_url, shard_requests=bad.shard_requests,
               cap_s=cap_s)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", type=Path, default=REPO, help="checkout whose swarmrl to run (default: this one)")
    ap.add_argument("--modes", default="stall,drip", help="comma list: stall, drip")
    ap.add_argument("--cap-s", type=float, default=150.0, help="kill a fetch still running after this long")
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="shardcast_stall_", dir="/tmp"))
    try:
        for mode in a.modes.split(","):
            print(json.dumps(run(a.code.resolve(), mode, a.cap_s, base)), flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
