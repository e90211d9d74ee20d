"""Orchestrator heartbeat throughput and tail latency vs. the number of registered nodes.

A real orchestrator (uvicorn, SQLite file or --database-url) runs in a child process on loopback.
Simulated nodes send Ed25519-signed heartbeats (each one: signature check, nonce check and insert, liveness
update, assignment lookup, seeded tasks in the reply) from a pool of concurrent connections; the baseline is
the unsigned no-op ``GET /v1/ping`` on the same server in the same run. For each node count the nodes are
registered in bulk straight into the database (with their step-0 assignment), then the orchestrator is
(re)started on that database, as after a restart, and every node beats once (the cold rate: a node's first beat
at a step derives its seeded tasks); then the steady state is measured: heartbeats of random known nodes. The
start-up time (loading that membership) is reported too.

    python benchmarks/orchestrator/bench.py                       # 10,000 and 100,000 nodes, SQLite
    python benchmarks/orchestrator/bench.py --nodes 100,1000 --seconds 5
    python benchmarks/orchestrator/bench.py --database-url "$(bash scripts/ci-postgres.sh)"
    python benchmarks/orchestrator/bench.py --both-paths --out benchmarks/orchestrator/results_sqlite.json

Prints one line per node count, and ends with one JSON line (the largest node count; ``by_nodes`` has all):
``nodes``, ``heartbeats_per_s``, ``p99_ms``, ``ping_per_s``. ``--both-paths`` measures the hot path, then the
full path (``fast_heartbeats=false``, on a fresh database, without the cold pass); ``--out`` writes every row of
both with the date and the command (``benchmarks/orchestrator/results_*.json`` are written so).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from swarmrl.contract import RLContract, task_seed, thinking_budget  # noqa: E402
from swarmrl.protocol.config import OrchestratorConfig  # noqa: E402
from swarmrl.protocol.db import Database, sqlite_url  # noqa: E402
from swarmrl.protocol.signing import generate_key, node_id_for, public_key_hex, sign_request  # noqa: E402
from swarmrl.protocol.tables import Assignment, LedgerEntry, Node  # noqa: E402

SERVER = """
import json, sys
from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.orchestrator import serve
serve(OrchestratorConfig.model_validate(json.loads(sys.argv[1])))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bulk_register(db: Database, cfg: OrchestratorConfig, keys: list, start: int, stop: int) -> None:
    now = time.time()
    c = cfg.contract
    tl = thinking_budget(1000.0, c.budget.tiers, cfg.tasks_per_node, c.group_size, c.budget.step_time_s) \
        if c.budget.enabled else None
    with db.tx() as s:
        for k in keys[start:stop]:
            pub = public_key_hex(k)
            nid = node_id_for(pub)
            s.add(Node(id=nid, public_key=pub, role="worker", status="active", hardware={}, throughput=1000.0,
                       registered_at=now, last_heartbeat=now + 3600))
        s.flush()
        for k in keys[start:stop]:
            nid = node_id_for(public_key_hex(k))
            s.add(LedgerEntry(node_id=nid, kind="stake", amount=100.0, created_at=now, note="bench"))
            s.add(Assignment(node_id=nid, origin_node_id=nid, step=0, seed=task_seed(nid, 0, cfg.run_secret),
                             env=c.task.name, env_params={}, n_tasks=cfg.tasks_per_node, group_size=c.group_size,
                             policy_version=0, target_length=tl, status="open", created_at=now))


async def load(url: str, seconds: float, concurrency: int, make_request, count: int = 0,  # noqa: ANN001
               ) -> tuple[list[float], dict[int, int]]:
    """Closed loop: ``concurrency`` connections, each sending its next request when the last one is answered,
    for ``seconds`` (or until ``count`` requests were sent). Returns the latencies of the 200s and a count of
    every status."""
    lat: list[float] = []
    statuses: dict[int, int] = {}
    stop_at = time.perf_counter() + seconds
    sent = 0
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(url, connector=conn, timeout=aiohttp.ClientTimeout(total=30)) as session:
        async def worker() -> None:
            nonlocal sent
            while time.perf_counter() < stop_at and not (count and sent >= count):
                sent += 1
                method, path, body, headers = make_request()
                t0 = time.perf_counter()
                async with session.request(method, path, data=body, headers=headers) as r:
                    await r.read()
                    statuses[r.status] = statuses.get(r.status, 0) + 1
                    if r.status == 200:
                        lat.append(time.perf_counter() - t0)
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return lat, statuses


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def start_server(cfg: OrchestratorConfig, log_path: Path) -> tuple[subprocess.Popen, float]:
    """The orchestrator in a child process; returns it and the seconds until it answered a ping."""
    import httpx

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, cfg.model_dump_json()], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(log_path, "ab"))
    url = f"http://127.0.0.1:{cfg.port}"
    while True:
        try:
            if httpx.get(url + "/v1/ping", timeout=2).status_code == 200:
                return proc, time.monotonic() - t0
        except httpx.HTTPError:
            pass
        if time.monotonic() - t0 > 300 or proc.poll() is not None:
            proc.kill()
            raise SystemExit(f"server did not start; see {log_path}")
        time.sleep(0.1)


def measure_path(args: argparse.Namespace, counts: list[int], keys: list, full: bool, cold: bool) -> list[dict]:
    """One path (the heartbeat hot path, or the full path: ``fast_heartbeats=false``) on a fresh database: for
    each node count, register up to it, (re)start the server, the cold pass (if ``cold``), then ping and
    heartbeats for ``--seconds`` each. One row per node count (printed as it is measured)."""
    tmp = Path(tempfile.mkdtemp(prefix="swarmrl-bench-"))
    cfg = OrchestratorConfig(data_dir=str(tmp), database_url=args.database_url, port=free_port(),
                             heartbeat_interval_s=3600.0, rate_limit_per_s=1e6, rate_limit_burst=1_000_000,
                             run_secret="bench", tasks_per_node=8, workers=args.workers,
                             contract=RLContract(group_size=4, budget={"enabled": True, "tiers": [64, 128, 256],
                                                                       "step_time_s": 60.0}),
                             fast_heartbeats=not full)
    db = Database(cfg.database_url or sqlite_url(tmp / "orchestrator.db"))
    if args.database_url:
        db.drop_all()
    db.create_all()
    url = f"http://127.0.0.1:{cfg.port}"
    body = json.dumps({"status": {}}).encode()
    results = []
    registered = 0
    for n in counts:
        t0 = time.monotonic()
        bulk_register(db, cfg, keys, registered, n)
        print(f"registered {n} nodes in the database ({time.monotonic() - t0:.1f} s)", flush=True)
        registered = n
        proc, startup_s = start_server(cfg, tmp / "server.log")
        try:
            pool = keys[:n]
            order = random.sample(pool, n)

            def heartbeat(pick=lambda: random.choice(pool)):  # noqa: ANN001, ANN202
                k = pick()
                h = sign_request(k, "POST", "/v1/nodes/heartbeat", body)
                h["Content-Type"] = "application/json"
                return "POST", "/v1/nodes/heartbeat", body, h

            def ping():  # noqa: ANN202
                return "GET", "/v1/ping", None, None

            # warm-up: every node beats once after the (re)start (the first beat of a node at a step derives its
            # tasks; reported as the cold rate), then the steady state is measured
            t0 = time.perf_counter()
            lc, sc = asyncio.run(load(url, 3600.0 if cold else 0.0, args.concurrency,
                                      lambda: heartbeat(order.pop), count=n))
            cold_s = max(time.perf_counter() - t0, 1e-9)
            asyncio.run(load(url, 2.0, args.concurrency, heartbeat))  # warm up
            lb, sb = asyncio.run(load(url, args.seconds, args.concurrency, ping))
            lh, sh = asyncio.run(load(url, args.seconds, args.concurrency, heartbeat))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        row = {"nodes": n, "concurrency": args.concurrency, "startup_s": round(startup_s, 2),
               "heartbeats_per_s": round(len(lh) / args.seconds, 1), "p50_ms": round(1e3 * pct(lh, 0.5), 2),
               "p99_ms": round(1e3 * pct(lh, 0.99), 2), "heartbeat_statuses": sh,
               "ping_per_s": round(len(lb) / args.seconds, 1), "ping_p99_ms": round(1e3 * pct(lb, 0.99), 2),
               "cold_heartbeats_per_s": round(len(lc) / cold_s, 1), "cold_p99_ms": round(1e3 * pct(lc, 0.99), 2),
               "cold_statuses": sc}
        row["throughput_vs_ping"] = round(row["heartbeats_per_s"] / row["ping_per_s"], 3)
        results.append(row)
        print(f"{'full' if full else 'hot'} path, {n:>7} nodes: {row['heartbeats_per_s']:7.1f} signed heartbeats/s "
              f"(p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms, statuses {sh}) | baseline ping "
              f"{row['ping_per_s']:7.1f}/s p99 {row['ping_p99_ms']:.1f} ms | {row['throughput_vs_ping']:.3f}x ping | "
              f"start-up {startup_s:.1f} s; first beat of each node after it: {row['cold_heartbeats_per_s']:.1f}/s "
              f"p99 {row['cold_p99_ms']:.1f} ms", flush=True)
    db.dispose()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="10000,100000", help="node counts, ascending, comma-separated")
    ap.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    ap.add_argument("--concurrency", type=int, default=16, help="connections sending heartbeats at once")
    ap.add_argument("--database-url", "--db", default="", help="PostgreSQL URL (default: a fresh SQLite file)")
    ap.add_argument("--workers", type=int, default=1, help="server processes (PostgreSQL only)")
    ap.add_argument("--full-path", action="store_true", help="turn the heartbeat hot path off (fast_heartbeats=false)")
    ap.add_argument("--both-paths", action="store_true",
                    help="the hot path, then the full path on a fresh database (its cold pass skipped)")
    ap.add_argument("--no-cold", action="store_true", help="skip the pass where every node beats once")
    ap.add_argument("--out", default="", help="write results JSON here (date, command, hot_path / full_path rows)")
    args = ap.parse_args()
    counts = sorted(int(x) for x in args.nodes.split(","))
    print(f"generating {max(counts)} node keys...", flush=True)
    keys = [generate_key() for _ in range(max(counts))]
    paths: dict[str, list[dict]] = {}
    if args.both_paths or not args.full_path:
        paths["hot_path"] = measure_path(args, counts, keys, full=False, cold=not args.no_cold)
    if args.both_paths or args.full_path:
        paths["full_path"] = measure_path(args, counts, keys, full=True, cold=not (args.no_cold or args.both_paths))
    database = "postgresql" if args.database_url else "sqlite"
    if args.out:
        argv = [re.sub(r"//[^@/]*@", "//...@", a) for a in sys.argv[1:]]  # no database password in the file
        Path(args.out).write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "database": database,
                                              "command": " ".join(["benchmarks/orchestrator/bench.py", *argv]),
                                              **paths}, indent=2) + "\n")
    results = paths.get("hot_path") or paths["full_path"]
    last = results[-1]
    print(json.dumps({"nodes": last["nodes"], "heartbeats_per_s": last["heartbeats_per_s"], "p99_ms": last["p99_ms"],
                      "ping_per_s": last["ping_per_s"], "database": database, "hot_path": "hot_path" in paths,
                      "by_nodes": results, **({"full_path_by_nodes": paths["full_path"]}
                                              if args.both_paths else {})}))


if __name__ == "__main__":
    main()
