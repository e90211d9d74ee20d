"""SHARDCAST benchmark on loopback; every figure is a ratio against curl measured in the same run.

1. single: one client (``swarmrl shardcast fetch``: signed manifest, per-shard + whole-file BLAKE3, temp file +
   rename) fetching a checkpoint from one origin server, against curl fetching the same shards from the same server
   into one file; both timed the same way, as a process from start to exit (``fetch_over_curl`` = curl time /
   ours, higher is better). Until 2026-11-26 ours was timed around the ``fetch`` call inside its process, so
   without the interpreter's start-up that curl's time included.
2. cli: ``swarmrl shardcast fetch`` of ``--cli-mib`` (200 MiB) as a new process, start-up included, against
   curl of the same shards (``cli_over_curl`` = CLI wall time / curl wall time, lower is better). The code's
   package is byte-compiled first, as an installed package is (``--no-compile`` to time it without .pyc files).
3. tree, capped (``relay_tree_over_direct``): machines with equal uplinks. The origin and each of the 2 relays
   cap their upload at ``--uplink-mbps`` (``max_upload_mbps``); baseline: 8 concurrent curls straight from the
   capped origin; ours: origin -> 2 relays -> 8 clients (4 per relay), from publish to the last client verified.
   Ratio = curl span / tree span (higher is better). On one box the cap stands in for each machine's own uplink.
4. tree, uncapped (``relay_tree_over_direct_uncapped``): the same without caps, everything on the same 2 cores:
   here relays only add processes competing for the same CPU, so this cannot show added capacity.

Every server and client is its own process. ``--code DIR`` runs the code of another checkout (before/after
in one sitting); scenarios that checkout cannot run (no upload cap) are skipped. Files live under /tmp and are
removed at the end. Ends with one JSON line.

    python benchmarks/shardcast/bench.py [--size-mib 512] [--cli-mib 200] [--fanout-mib 128] [--uplink-mbps 800]
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

SERVE_ORIGIN = r"""
import asyncio, inspect, sys
from swarmrl.shardcast import ShardServer
async def main():
    kw = {}
    if float(sys.argv[2]) > 0:
        kw["max_upload_mbps"] = float(sys.argv[2])
    s = ShardServer(sys.argv[1], **kw); await s.start()
    print(s.url, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""

SERVE_RELAY = r"""
import asyncio, sys
from swarmrl.shardcast import Relay
async def main():
    cap = float(sys.argv[4]) if float(sys.argv[4]) > 0 else None
    try:  # a relay's serving settings are one Serving since issue 41; --code may name a checkout from before
        from swarmrl.shardcast.server.shard_server import Serving
        kw = {"serving": Serving(max_upload_mbps=cap)}
    except ImportError:
        kw = {"max_upload_mbps": cap} if cap else {}
    r = Relay(sys.argv[1], sys.argv[3].split(","), sys.argv[2], metrics=sys.argv[1] + ".jsonl", **kw)  # 4 in flight
    print(await r.start(), flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""

CLIENT = r"""
import json, sys, time
from swarmrl.shardcast import fetch
try:  # the fetch settings are one FetchOptions since issue 41; --code may name a checkout from before
    from swarmrl.shardcast import FetchOptions
    kw = {"options": FetchOptions(wait_s=600)}
except ImportError:
    kw = {"wait_s": 600}
res = fetch(sys.argv[1].split(","), sys.argv[2], sys.argv[3], version=int(sys.argv[4]), **kw)
print(json.dumps({"end": time.time(), "seconds": res.seconds, "size": res.size,
                  "excluded": res.excluded}), flush=True)
"""

CLI = "import sys; from swarmrl.cli import main; sys.argv[0] = 'swarmrl'; sys.exit(main())"


def _env(code: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(code) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def spawn(code: Path, script: str, *args: object) -> tuple[subprocess.Popen[str], str]:
    p = subprocess.Popen([sys.executable, "-P", "-c", script, *map(str, args)], stdout=subprocess.PIPE, text=True,
                         env=_env(code))
    assert p.stdout is not None
    url = p.stdout.readline().strip()
    if not url.startswith("http://"):
        p.kill()
        raise RuntimeError(f"server failed to start: {url!r}")
    return p, url


def make_file(path: Path, size: int) -> None:
    with path.open("wb") as f:
        left = size
        while left:
            n = min(64 << 20, left)
            f.write(os.urandom(n))
            left -= n


def shard_glob(url: str, version: int, num_shards: int) -> str:
    """One curl URL for every shard of a version (curl's [a-b] globbing; one kept-alive connection)."""
    return f"{url}/v{version}/shard_[00001-{num_shards:05d}].bin"


def curl_to(url_glob: str, out: Path) -> subprocess.Popen[bytes]:
    f = out.open("wb")
    p = subprocess.Popen(["curl", "-sSf", url_glob], stdout=f)
    f.close()
    return p


def run_curl(url_glob: str, out: Path, size: int) -> float:
    t = time.perf_counter()
    if curl_to(url_glob, out).wait() != 0:
        raise RuntimeError("curl failed")
    dt = time.perf_counter() - t
    assert out.stat().st_size == size, out.stat().st_size
    out.unlink()
    return dt


def kill(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        p.kill()
        p.wait()
    procs.clear()


def publish(code: Path, base: Path, name: str, size: int, shard_mb: float) -> tuple[Path, str, int]:
    """A fresh origin dir with ``size`` random bytes published as v1 (in a subprocess of the code under test)."""
    src = base / f"{name}.safetensors"
    make_file(src, size)
    script = ("import sys; from swarmrl.shardcast import Origin; o = Origin(sys.argv[1], key=sys.argv[2], "
              "shard_size=int(sys.argv[4])); m = o.publish_sync(sys.argv[3], version=1).manifest; "
              "print(o.public_key, m.num_shards); o.close()")
    out = subprocess.run([sys.executable, "-P", "-c", script, str(base / name), str(base / "origin.key"), str(src),
                          str(int(shard_mb * 1e6))], env=_env(code), check=True, capture_output=True, text=True)
    pub, n = out.stdout.split()
    src.unlink()
    return base / name, pub, int(n)


def compile_code(args: argparse.Namespace, code: Path) -> None:
    """The bytecode an installed package has (PYTHONDONTWRITEBYTECODE would skip writing it)."""
    if not args.no_compile:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(code / "swarmrl")], check=True,
                       capture_output=True)


def run_cli_fetch(code: Path, url: str, pub: str, out: Path, size: int) -> float:
    """``swarmrl shardcast fetch`` as a new process, timed as ``run_curl`` times curl: start to exit."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-P", "-c", CLI, "shardcast", "fetch", "--server", url, "--origin-pubkey", pub,
                    "--out", str(out), "--version", "1"], env=_env(code), check=True, capture_output=True)
    dt = time.perf_counter() - t
    assert out.stat().st_size == size
    out.unlink()
    return dt


def bench_single(args: argparse.Namespace, code: Path, base: Path, procs: list) -> dict:
    size = args.size_mib << 20
    root, pub, n = publish(code, base, "single", size, args.shard_mb)
    p, url = spawn(code, SERVE_ORIGIN, root, 0)
    procs.append(p)
    compile_code(args, code)
    curl_t, ours_t = [], []
    for _ in range(args.repeats):
        curl_t.append(run_curl(shard_glob(url, 1, n), base / "curl.bin", size))
        ours_t.append(run_cli_fetch(code, url, pub, base / "ours.bin", size))
    kill(procs)
    shutil.rmtree(root)
    c, o = statistics.median(curl_t), statistics.median(ours_t)
    print(f"[single] {args.size_mib} MiB, {n} shards: curl from the same server median {c:.2f} s = "
          f"{size / 1e6 / c:.0f} MB/s (runs {', '.join(f'{x:.2f}' for x in curl_t)})")
    print(f"[single] `swarmrl shardcast fetch` (verified), as a process like curl: median {o:.2f} s = "
          f"{size / 1e6 / o:.0f} MB/s (runs {', '.join(f'{x:.2f}' for x in ours_t)}); fetch_over_curl = {c / o:.2f}x")
    return {"size_mib": args.size_mib, "curl_s": curl_t, "ours_s": ours_t, "curl_MBps": size / 1e6 / c,
            "ours_MBps": size / 1e6 / o, "fetch_over_curl": c / o}


def bench_cli(args: argparse.Namespace, code: Path, base: Path, procs: list) -> dict:
    size = args.cli_mib << 20
    root, pub, n = publish(code, base, "cli", size, args.shard_mb)
    p, url = spawn(code, SERVE_ORIGIN, root, 0)
    procs.append(p)
    compile_code(args, code)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-P", "-c", CLI, "shardcast", "fetch", "--help"], env=_env(code), check=True,
                   capture_output=True)
    help_s = time.perf_counter() - t
    curl_t, cli_t = [], []
    for _ in range(args.repeats):
        curl_t.append(run_curl(shard_glob(url, 1, n), base / "curl.bin", size))
        cli_t.append(run_cli_fetch(code, url, pub, base / "cli.bin", size))
    kill(procs)
    shutil.rmtree(root)
    c, o = statistics.median(curl_t), statistics.median(cli_t)
    print(f"[cli] {args.cli_mib} MiB: curl median {c:.2f} s (runs {', '.join(f'{x:.2f}' for x in curl_t)}); "
          f"`swarmrl shardcast fetch` median {o:.2f} s incl. start-up (runs {', '.join(f'{x:.2f}' for x in cli_t)}); "
          f"`shardcast fetch --help` {help_s:.2f} s; cli_over_curl = {o / c:.2f}x"
          + ("" if not args.no_compile else " (--no-compile: modules without .pyc compiled on each start)"))
    return {"size_mib": args.cli_mib, "curl_s": curl_t, "cli_s": cli_t, "cli_help_s": help_s, "cli_over_curl": o / c,
            "compiled": not args.no_compile}


def bench_tree(args: argparse.Namespace, code: Path, base: Path, procs: list, mbps: float) -> dict:
    tag = f"capped at {mbps:g} Mb/s per server" if mbps else "uncapped"
    size = args.fanout_mib << 20
    root, pub, n = publish(code, base, "tree", size, args.shard_mb)
    # baseline: N concurrent curls straight from the (capped) origin
    p, url = spawn(code, SERVE_ORIGIN, root, mbps)
    t = time.perf_counter()
    curls = [curl_to(shard_glob(url, 1, n), base / f"curl{i}.bin") for i in range(args.clients)]
    if any(c.wait() != 0 for c in curls):
        raise RuntimeError("curl failed")
    curl_span = time.perf_counter() - t
    p.kill()
    p.wait()
    for i in range(args.clients):
        assert (base / f"curl{i}.bin").stat().st_size == size
        (base / f"curl{i}.bin").unlink()
    # ours: the version is published (moved into place) while the tree and the clients wait for it
    hidden = base / "tree_staged"
    os.replace(root, hidden)
    root.mkdir()
    p, origin_url = spawn(code, SERVE_ORIGIN, root, mbps)
    procs.append(p)
    relays = []
    for i in range(2):
        p, rurl = spawn(code, SERVE_RELAY, base / f"relay{i}_{int(mbps)}", pub, origin_url, mbps)
        procs.append(p)
        relays.append(rurl)
    clients = [subprocess.Popen([sys.executable, "-P", "-c", CLIENT, relays[i % 2], str(base / f"client{i}.bin"), pub, "1"],
                                stdout=subprocess.PIPE, text=True, env=_env(code)) for i in range(args.clients)]
    time.sleep(3.0)  # the client processes start (imports) and begin waiting
    t_pub = time.time()
    os.replace(hidden / "v1", root / "v1")  # the shards and the signed manifest, then the listing
    os.replace(hidden / "distribution.txt", root / "distribution.txt")
    ends = []
    for cp in clients:
        out_s, _ = cp.communicate(timeout=1200)
        if cp.returncode != 0:
            raise RuntimeError(f"client failed rc={cp.returncode}")
        ends.append(json.loads(out_s.strip().splitlines()[-1]))
    kill(procs)
    span = max(e["end"] for e in ends) - t_pub
    for i in range(args.clients):
        (base / f"client{i}.bin").unlink()
    shutil.rmtree(root)
    shutil.rmtree(hidden)
    ratio = curl_span / span
    print(f"[tree {tag}] {args.fanout_mib} MiB, {n} shards, {args.clients} clients: {args.clients} direct curls from "
          f"the origin {curl_span:.2f} s ({args.clients * size / 1e6 / curl_span:.0f} MB/s); origin -> 2 relays -> "
          f"clients, publish to last client verified {span:.2f} s ({args.clients * size / 1e6 / span:.0f} MB/s); "
          f"ratio {ratio:.2f}x")
    return {"size_mib": args.fanout_mib, "clients": args.clients, "uplink_mbps": mbps or None,
            "direct_curl_s": curl_span, "tree_s": span, "ratio": ratio}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=512, help="single-client checkpoint size")
    ap.add_argument("--cli-mib", type=int, default=200)
    ap.add_argument("--fanout-mib", type=int, default=128)
    ap.add_argument("--uplink-mbps", type=float, default=800.0,
                    help="per-server upload cap of the capped tree (megabits per second)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--shard-mb", type=float, default=50.0, help="shard size in MB (50 = public default)")
    ap.add_argument("--skip", default="", help="comma list of scenarios to skip: single,cli,capped,uncapped")
    ap.add_argument("--no-compile", action="store_true",
                    help="cli: do not byte-compile the code under test first (where PYTHONDONTWRITEBYTECODE is set, "
                         "its modules are then compiled from source on every start)")
    ap.add_argument("--code", type=Path, default=REPO, help="checkout whose swarmrl to run (default: this one)")
    ap.add_argument("--out", type=Path, default=None, help="optional JSON results file")
    args = ap.parse_args()
    code = args.code.resolve()
    skip = set(filter(None, args.skip.split(",")))
    probe = subprocess.run([sys.executable, "-P", "-c", "import inspect; from swarmrl.shardcast import ShardServer; "
                            "print('max_upload_mbps' in inspect.signature(ShardServer).parameters)"],
                           env=_env(code), capture_output=True, text=True, check=True)
    if probe.stdout.strip() != "True":
        print(f"[tree capped] skipped: {code} has no upload cap")
        skip.add("capped")
    base = Path(tempfile.mkdtemp(prefix="shardcast_bench_", dir="/tmp"))
    procs: list[subprocess.Popen[str]] = []
    results: dict[str, object] = {"code": str(code)}
    summary: dict[str, object] = {}
    try:
        if "single" not in skip:
            r = results["single"] = bench_single(args, code, base, procs)
            summary["fetch_over_curl"] = round(r["fetch_over_curl"], 3)
        if "capped" not in skip:
            r = results["tree_capped"] = bench_tree(args, code, base, procs, args.uplink_mbps)
            summary["relay_tree_over_direct"] = round(r["ratio"], 3)
            summary["uplink_mbps"] = args.uplink_mbps
        if "cli" not in skip:
            r = results["cli"] = bench_cli(args, code, base, procs)
            summary["cli_over_curl"] = round(r["cli_over_curl"], 3)
            summary["cli_help_s"] = round(r["cli_help_s"], 3)
            summary["cli_compiled"] = r["compiled"]
        if "uncapped" not in skip:
            r = results["tree_uncapped"] = bench_tree(args, code, base, procs, 0.0)
            summary["relay_tree_over_direct_uncapped"] = round(r["ratio"], 3)
    finally:
        kill(procs)
        shutil.rmtree(base, ignore_errors=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    summary.update(size_mib=args.size_mib, cli_mib=args.cli_mib, fanout_mib=args.fanout_mib, clients=args.clients,
                   shard_mb=args.shard_mb)
    print(json.dumps({k: summary.get(k) for k in ("fetch_over_curl", "relay_tree_over_direct", "cli_over_curl")}
                     | summary))


if __name__ == "__main__":
    main()
