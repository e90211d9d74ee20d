"""Orchestrator heartbeat throughput and tail latency vs. the number of registered nodes.

A real orchestrator (uvicorn, SQLite file or --database-url) runs in a child process on loopback.
Simulated nodes send Ed25519-signed heartbeats (each one: signature check, nonce insert, liveness
update, assignment lookup, seeded tasks in the reply) from a pool of concurrent connections; the
baseline is the unsigned no-op ``GET /v1/ping`` on the same server in the same run. Nodes are
registered in bulk straight into the database (with their step-0 assignment) between phases, so
every measured heartbeat is a steady-state one.

    python benchmarks/orchestrator/bench.py                 # 100 -> 1,000 -> 10,000 nodes
    python benchmarks/orchestrator/bench.py --nodes 100,1000 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from swarmrl.contract import task_seed, thinking_budget  # noqa: E402
from swarmrl.protocol.config import OrchestratorConfig  # noqa: E402
from swarmrl.protocol.db import Database, sqlite_url  # noqa: E402
from swarmrl.protocol.models import Assignment, LedgerEntry, Node  # noqa: E402
from swarmrl.protocol.signing import generate_key, node_id_for, public_key_hex, sign_request  # noqa: E402

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
    tl = thinking_budget(1000.0, cfg.budget_tiers, cfg.tasks_per_node, cfg.group_size, cfg.target_step_time_s)
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
                             env=cfg.task.name, env_params={}, n_tasks=cfg.tasks_per_node, group_size=cfg.group_size,
                             policy_version=0, target_length=tl, status="open", created_at=now))


async def load(url: str, seconds: float, concurrency: int, make_request) -> tuple[int, list[float], int]:  # noqa: ANN001
    lat: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(url, connector=conn) as session:
        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < stop_at:
                method, path, body, headers = make_request()
                t0 = time.perf_counter()
                async with session.request(method, path, data=body, headers=headers) as r:
                    await r.read()
                    if r.status != 200:
                        errors += 1
                lat.append(time.perf_counter() - t0)
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(lat), lat, errors


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="100,1000,10000")
    ap.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--database-url", default="")
    ap.add_argument("--workers", type=int, default=1, help="server processes (PostgreSQL only)")
    ap.add_argument("--out", default="", help="write results JSON here")
    args = ap.parse_args()
    counts = [int(x) for x in args.nodes.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="swarmrl-bench-"))
    cfg = OrchestratorConfig(data_dir=str(tmp), database_url=args.database_url, port=free_port(),
                             heartbeat_interval_s=3600.0, rate_limit_per_s=1e6, rate_limit_burst=1_000_000,
                             run_secret="bench", tasks_per_node=8, group_size=4, workers=args.workers)
    db = Database(cfg.database_url or sqlite_url(tmp / "orchestrator.db"))
    if args.database_url:
        db.drop_all()
    db.create_all()
    print(f"generating {max(counts)} node keys...", flush=True)
    keys = [generate_key() for _ in range(max(counts))]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", SERVER, cfg.model_dump_json()], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(tmp / "server.log", "wb"))
    url = f"http://127.0.0.1:{cfg.port}"
    results = []
    try:
        import httpx

        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/v1/ping", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"server did not start; see {tmp / 'server.log'}")
            time.sleep(0.2)
        registered = 0
        body = json.dumps({"status": {}}).encode()
        for n in counts:
            bulk_register(db, cfg, keys, registered, n)
            registered = n
            pool = keys[:n]

            def heartbeat():  # noqa: ANN202
                k = random.choice(pool)
                h = sign_request(k, "POST", "/v1/nodes/heartbeat", body)
                h["Content-Type"] = "application/json"
                return "POST", "/v1/nodes/heartbeat", body, h

            def ping():  # noqa: ANN202
                return "GET", "/v1/ping", None, None

            asyncio.run(load(url, 1.0, args.concurrency, heartbeat))  # warm up
            nb, lb, eb = asyncio.run(load(url, args.seconds, args.concurrency, ping))
            nh, lh, eh = asyncio.run(load(url, args.seconds, args.concurrency, heartbeat))
            row = {"nodes": n, "concurrency": args.concurrency,
                   "heartbeats_per_s": nh / args.seconds, "heartbeat_p50_ms": 1e3 * pct(lh, 0.5),
                   "heartbeat_p99_ms": 1e3 * pct(lh, 0.99), "heartbeat_errors": eh,
                   "ping_per_s": nb / args.seconds, "ping_p99_ms": 1e3 * pct(lb, 0.99), "ping_errors": eb}
            row["throughput_vs_ping"] = row["heartbeats_per_s"] / row["ping_per_s"]
            row["p99_vs_ping"] = row["heartbeat_p99_ms"] / row["ping_p99_ms"]
            results.append(row)
            print(f"{n:>6} nodes: {row['heartbeats_per_s']:7.1f} signed heartbeats/s "
                  f"(p50 {row['heartbeat_p50_ms']:.1f} ms, p99 {row['heartbeat_p99_ms']:.1f} ms, {eh} errors) | "
                  f"baseline ping {row['ping_per_s']:7.1f}/s p99 {row['ping_p99_ms']:.1f} ms | "
                  f"ratio {row['throughput_vs_ping']:.3f}x throughput, {row['p99_vs_ping']:.1f}x p99", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    first = results[0]
    for r in results[1:]:
        print(f"{first['nodes']} -> {r['nodes']} nodes: heartbeat throughput x{r['heartbeats_per_s'] / first['heartbeats_per_s']:.2f}, "
              f"p99 x{r['heartbeat_p99_ms'] / first['heartbeat_p99_ms']:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
