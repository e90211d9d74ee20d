"""SHARDCAST benchmark on loopback.

1. One client fetching a 1 GiB checkpoint (50 MB shards, signed manifest, per-shard + whole-file
   BLAKE3 check, temp file + rename) from one origin, against curl downloading the same file as
   one static file from an aiohttp FileResponse server (sendfile) in the same run.
2. Fan-out: origin -> 2 relays -> 8 client processes started before the publish; reports the time
   from publish() to the last client verified, and the aggregate client MB/s.

Every server and client is its own process (as in deployment). Files live under /tmp and are
removed at the end. Usage: python benchmarks/shardcast/bench.py [--size-mib 1024] [--fanout-mib 256]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

SERVE_STATIC = r"""
import asyncio, sys
from aiohttp import web
path = sys.argv[1]
async def main():
    async def h(request):
        return web.FileResponse(path, chunk_size=1 << 20)
    app = web.Application()
    app.router.add_get("/file.bin", h)
    r = web.AppRunner(app, access_log=None); await r.setup()
    s = web.TCPSite(r, "127.0.0.1", 0); await s.start()
    print(f"http://127.0.0.1:{s._server.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""

SERVE_ORIGIN = r"""
import asyncio, sys
from swarmrl.shardcast import ShardServer
async def main():
    s = ShardServer(sys.argv[1]); await s.start()
    print(s.url, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""

SERVE_RELAY = r"""
import asyncio, sys
from swarmrl.shardcast import Relay
async def main():
    r = Relay(sys.argv[1], sys.argv[3].split(","), sys.argv[2], parallel=4, metrics=sys.argv[1] + ".jsonl")
    print(await r.start(), flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""

CLIENT = r"""
import json, sys, time
from swarmrl.shardcast import fetch
res = fetch(sys.argv[1].split(","), sys.argv[2], sys.argv[3], version=int(sys.argv[4]), wait_s=600, parallel=8)
print(json.dumps({"end": time.time(), "seconds": res.seconds, "size": res.size,
                  "excluded": res.excluded}), flush=True)
"""


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def spawn(code: str, *args: str) -> tuple[subprocess.Popen[str], str]:
    p = subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE, text=True,
                         env=_env())
    assert p.stdout is not None
    url = p.stdout.readline().strip()
    if not url.startswith("http://"):
        p.kill()
        raise RuntimeError(f"server failed to start: {url!r}")
    return p, url


def make_file(path: Path, size: int) -> None:
    chunk = 64 << 20
    with path.open("wb") as f:
        left = size
        while left:
            n = min(chunk, left)
            f.write(os.urandom(n))
            left -= n


def drop(path: Path) -> None:
    path.unlink(missing_ok=True)


def bench_single(args: argparse.Namespace, base: Path, procs: list) -> dict:
    from swarmrl.shardcast import Origin, fetch

    size = args.size_mib << 20
    src = base / "model.safetensors"
    make_file(src, size)
    origin = Origin(base / "origin", key=base / "origin.key", shard_size=int(args.shard_mb * 1e6))
    t0 = time.perf_counter()
    pub = origin.publish(src, version=1)
    submit_s = time.perf_counter() - t0
    pub.result()
    publish_s = time.perf_counter() - t0
    p, static_url = spawn(SERVE_STATIC, src)
    procs.append(p)
    p, origin_url = spawn(SERVE_ORIGIN, origin.root)
    procs.append(p)
    curl_t, ours_t = [], []
    for _ in range(args.repeats):
        out = base / "curl.bin"
        t = time.perf_counter()
        subprocess.run(["curl", "-sSf", "-o", str(out), f"{static_url}/file.bin"], check=True)
        curl_t.append(time.perf_counter() - t)
        assert out.stat().st_size == size
        drop(out)
        out = base / "ours.bin"
        t = time.perf_counter()
        res = fetch([origin_url], out, origin.public_key, version=1, parallel=8)
        ours_t.append(time.perf_counter() - t)
        assert res.size == size
        drop(out)
    c, o = statistics.median(curl_t), statistics.median(ours_t)
    print(f"[single] {args.size_mib} MiB: publish() returned in {submit_s * 1e3:.1f} ms, sharded+signed in "
          f"{publish_s:.2f} s")
    print(f"[single] curl (static aiohttp sendfile server): median {c:.2f} s = {size / 1e6 / c:.0f} MB/s "
          f"(runs {', '.join(f'{x:.2f}' for x in curl_t)})")
    print(f"[single] shardcast fetch (8 parallel, verified): median {o:.2f} s = {size / 1e6 / o:.0f} MB/s "
          f"(runs {', '.join(f'{x:.2f}' for x in ours_t)})")
    print(f"[single] throughput ratio shardcast/curl = {c / o:.2f}x")
    for p in procs:
        p.kill()
        p.wait()
    procs.clear()
    origin.close()
    shutil.rmtree(base / "origin")
    drop(src)
    return {"size_mib": args.size_mib, "publish_submit_s": submit_s, "publish_total_s": publish_s,
            "curl_s": curl_t, "ours_s": ours_t, "curl_MBps": size / 1e6 / c, "ours_MBps": size / 1e6 / o,
            "ratio_vs_curl": c / o}


def bench_fanout(args: argparse.Namespace, base: Path, procs: list) -> dict:
    from swarmrl.shardcast import Origin
    from swarmrl.utils.metrics import read_metrics

    size = args.fanout_mib << 20
    src = base / "model2.safetensors"
    make_file(src, size)
    # baseline in the same run: N concurrent curls of the same file from one static sendfile server
    p, static_url = spawn(SERVE_STATIC, src)
    t = time.perf_counter()
    curls = [subprocess.Popen(["curl", "-sSf", "-o", str(base / f"curl{i}.bin"), f"{static_url}/file.bin"])
             for i in range(args.clients)]
    for c in curls:
        if c.wait() != 0:
            raise RuntimeError("curl failed")
    curl_span = time.perf_counter() - t
    curl_agg = args.clients * size / 1e6 / curl_span
    p.kill()
    p.wait()
    for i in range(args.clients):
        drop(base / f"curl{i}.bin")
    print(f"[fanout] baseline: {args.clients} concurrent curls from one static server: {curl_span:.2f} s, "
          f"{curl_agg:.0f} MB/s aggregate")

    origin = Origin(base / "origin2", key=base / "origin.key", shard_size=int(args.shard_mb * 1e6))
    p, origin_url = spawn(SERVE_ORIGIN, origin.root)
    procs.append(p)
    relays = []
    for i in range(2):
        p, url = spawn(SERVE_RELAY, base / f"relay{i}", origin.public_key, origin_url)
        procs.append(p)
        relays.append(url)
    clients = []
    for i in range(args.clients):
        cp = subprocess.Popen(["nice", "-n", str(args.nice_clients)] * bool(args.nice_clients)
                              + [sys.executable, "-c", CLIENT, ",".join(relays), str(base / f"client{i}.bin"),
                                 origin.public_key, "1"], stdout=subprocess.PIPE, text=True, env=_env())
        clients.append(cp)
    time.sleep(3.0)  # let the client processes start (python import) and begin waiting
    t_pub = time.time()
    origin.publish(src, version=1).result()
    t_listed = time.time()
    ends = []
    for cp in clients:
        out_s, _ = cp.communicate(timeout=1200)
        if cp.returncode != 0:
            raise RuntimeError(f"client failed rc={cp.returncode}")
        ends.append(json.loads(out_s.strip().splitlines()[-1]))
    last = max(e["end"] for e in ends)
    first = min(e["end"] for e in ends)
    relay_done = [r["time"] for i in range(2) for r in read_metrics(base / f"relay{i}.jsonl")]
    span = last - t_pub
    agg = args.clients * size / 1e6 / span
    res = {"size_mib": args.fanout_mib, "shard_mb": args.shard_mb, "clients": args.clients, "relays": 2,
           "publish_to_listed_s": t_listed - t_pub, "publish_to_relays_complete_s": max(relay_done) - t_pub,
           "publish_to_first_client_s": first - t_pub, "publish_to_last_client_s": span,
           "aggregate_client_MBps": agg, "baseline_concurrent_curl_s": curl_span,
           "baseline_concurrent_curl_MBps": curl_agg, "ratio_vs_concurrent_curl": curl_span / span,
           "aggregate_client_MBps_after_listing": args.clients * size / 1e6 / (last - t_listed)}
    print(f"[fanout] {args.fanout_mib} MiB ({args.shard_mb:g} MB shards), origin -> 2 relays -> {args.clients} "
          f"clients: publish->listed at origin {res['publish_to_listed_s']:.2f} s, relays complete "
          f"{res['publish_to_relays_complete_s']:.2f} s, first client {first - t_pub:.2f} s, last client verified "
          f"{span:.2f} s")
    print(f"[fanout] aggregate client throughput {agg:.0f} MB/s from publish, "
          f"{res['aggregate_client_MBps_after_listing']:.0f} MB/s from listing; vs {args.clients} direct curls "
          f"(no relays, no verification): {curl_span / span:.2f}x")
    origin.close()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--fanout-mib", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--shard-mb", type=float, default=50.0, help="shard size in MB (50 = public default)")
    ap.add_argument("--skip-single", action="store_true")
    ap.add_argument("--nice-clients", type=int, default=0,
                    help="diagnostic: run clients at lower CPU priority (stands in for clients on other machines)")
    ap.add_argument("--skip-fanout", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="optional JSON results file")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="shardcast_bench_", dir="/tmp"))
    procs: list[subprocess.Popen[str]] = []
    results: dict[str, object] = {}
    try:
        if not args.skip_single:
            results["single"] = bench_single(args, base, procs)
        if not args.skip_fanout:
            results["fanout"] = bench_fanout(args, base, procs)
            if "single" in results:
                r = results["single"]["curl_MBps"]  # type: ignore[index]
                print(f"[fanout] aggregate / single-client curl baseline: "
                      f"{results['fanout']['aggregate_client_MBps'] / r:.2f}x")  # type: ignore[index]
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(base, ignore_errors=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
