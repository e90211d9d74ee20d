"""What a large membership costs one orchestrator: its resident memory, and the dashboard's stats answers.

A real orchestrator (the child process of ``bench.py``: uvicorn, SQLite file or --database-url, the hot path on)
is started twice in this invocation: on an empty database (the baseline) and on one holding ``--nodes``
registered nodes (bulk-inserted as ``bench.py`` does: node, stake, an open step-0 assignment each), as after a
restart. For each, the server's resident size (``VmRSS`` of its process) once it answers a ping and has idled
``--settle`` s; with ``--beat-all`` also after every node has sent one signed heartbeat (a node's first beat at a
step derives its tasks and caches its reply). Then, on the large one, ``--reps`` rounds of the dashboard's
``GET /v1/stats/nodes`` (1000 nodes) and ``GET /v1/stats/overview``, each round more than the stats cache's
second after the last, so every answer is computed afresh, and the unsigned ``GET /v1/ping`` in the same rounds
(the baseline). Prints one JSON line: ``rss_mib`` per database (MiB), ``rss_added_mib`` and ``bytes_per_node``, and per
path the median milliseconds, the reply's bytes and the ratio to ping.

    python benchmarks/orchestrator/footprint.py [--nodes 100000] [--reps 7] [--beat-all]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import httpx  # noqa: E402
from bench import ROOT, bulk_register, free_port, load, start_server  # noqa: E402

from swarmrl.contract import RLContract  # noqa: E402
from swarmrl.protocol.config import OrchestratorConfig  # noqa: E402
from swarmrl.protocol.db import Database, sqlite_url  # noqa: E402
from swarmrl.protocol.orchestrator.stats import STATS_CACHE_S  # noqa: E402
from swarmrl.protocol.signing import generate_key, sign_request  # noqa: E402

assert ROOT  # bench.py put the checkout on sys.path


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def config(tmp: Path, database_url: str) -> OrchestratorConfig:
    return OrchestratorConfig(data_dir=str(tmp), database_url=database_url, port=free_port(),
                              heartbeat_interval_s=3600.0, rate_limit_per_s=1e6, rate_limit_burst=1_000_000,
                              public_rate_per_s=1e6, public_burst=1_000_000, run_secret="bench", tasks_per_node=8,
                              contract=RLContract(group_size=4, budget={"enabled": True, "tiers": [64, 128, 256],
                                                                        "step_time_s": 60.0}))


def timed_gets(url: str, reps: int) -> dict:
    paths = {"nodes": "/v1/stats/nodes?limit=1000", "overview": "/v1/stats/overview", "ping": "/v1/ping"}
    times: dict[str, list[float]] = {k: [] for k in paths}
    size: dict[str, int] = {}
    with httpx.Client(base_url=url, timeout=120) as http:
        for p in paths.values():  # warm-up round (connection, first queries), untimed
            http.get(p).raise_for_status()
        for _ in range(reps):
            time.sleep(STATS_CACHE_S + 0.2)  # past the stats cache: every answer below is computed afresh
            for k, p in paths.items():
                t0 = time.perf_counter()
                r = http.get(p)
                times[k].append(time.perf_counter() - t0)
                r.raise_for_status()
                size[k] = len(r.content)
    ping = statistics.median(times["ping"])
    return {k: {"ms": round(1e3 * statistics.median(v), 1), "bytes": size[k],
                "over_ping": round(statistics.median(v) / ping, 1)} for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=7, help="rounds of the stats GETs (each > 1 s apart)")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds idle before reading the resident size")
    ap.add_argument("--beat-all", action="store_true", help="also the size after every node beat once")
    ap.add_argument("--database-url", "--db", default="", help="PostgreSQL URL (default: fresh SQLite files)")
    a = ap.parse_args()
    t0 = time.monotonic()
    keys = [generate_key() for _ in range(a.nodes)]
    print(f"{a.nodes} keys in {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    out: dict = {"bench": "orchestrator_footprint", "nodes": a.nodes,
                 "database": "postgresql" if a.database_url else "sqlite", "rss_mib": {}}
    for n in (0, a.nodes):
        tmp = Path(tempfile.mkdtemp(prefix="swarmrl-footprint-"))
        cfg = config(tmp, a.database_url)
        db = Database(cfg.database_url or sqlite_url(tmp / "orchestrator.db"))
        if a.database_url:
            db.drop_all()
        db.create_all()
        t0 = time.monotonic()
        bulk_register(db, cfg, keys, 0, n)
        db.dispose()
        print(f"registered {n} nodes in {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
        proc, startup_s = start_server(cfg, tmp / "server.log")
        url = f"http://127.0.0.1:{cfg.port}"
        try:
            time.sleep(a.settle)
            out["rss_mib"][str(n)] = round(rss_mib(proc.pid), 1)
            out.setdefault("startup_s", {})[str(n)] = round(startup_s, 2)
            if n and a.beat_all:
                body = json.dumps({"status": {}}).encode()
                order = list(keys[:n])

                def beat() -> tuple:
                    h = sign_request(order.pop(), "POST", "/v1/nodes/heartbeat", body)
                    h["Content-Type"] = "application/json"
                    return "POST", "/v1/nodes/heartbeat", body, h

                lat, statuses = asyncio.run(load(url, 3600.0, 16, beat, count=n))
                time.sleep(a.settle)
                out["rss_after_beats_mib"] = round(rss_mib(proc.pid), 1)
                out["beat_statuses"] = statuses
            if n:
                out["stats"] = timed_gets(url, a.reps)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    base, big = out["rss_mib"]["0"], out["rss_mib"][str(a.nodes)]
    out["rss_added_mib"] = round(big - base, 1)
    out["bytes_per_node"] = round((big - base) * 2**20 / max(1, a.nodes))
    if "rss_after_beats_mib" in out:
        out["rss_added_after_beats_mib"] = round(out["rss_after_beats_mib"] - base, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
