"""The sybil flood, as an outsider runs it: register N fresh Ed25519 keys against a running orchestrator as fast
as it can (one address; ``--concurrency`` connections), optionally heartbeat once with each key that got in (so
it is handed work in demand mode) and then go idle.

    python benchmarks/attacks/flood.py --orchestrator http://127.0.0.1:8700 --n 300 [--heartbeat] [--concurrency 4]

Prints ONE JSON line: attempted, registered, refused (count per HTTP status), heartbeats (that answered 200),
assignments (handed to the sybils by those heartbeats), seconds, the rates of attempts and of accepted
registrations per second, and the largest Retry-After seen. Only the public API is used: what any outsider has.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from swarmrl.protocol.signing import generate_key, sign_request  # noqa: E402


def _post(http: httpx.Client, key, path: str, body: dict) -> httpx.Response:  # noqa: ANN001
    data = json.dumps(body).encode()
    headers = sign_request(key, "POST", path, data)
    headers["Content-Type"] = "application/json"
    return http.post(path, content=data, headers=headers)


def flood(url: str, n: int, *, stake: float = 100.0, throughput: float = 10.0, hardware_bytes: int = 0,
          heartbeat: bool = False, concurrency: int = 1, timeout: float = 30.0) -> dict:
    refused: collections.Counter = collections.Counter()
    counts = {"registered": 0, "heartbeats": 0, "assignments": 0}
    retry_after = 0.0
    lock = threading.Lock()
    hardware = {"gpu": "H100", "pad": "x" * hardware_bytes} if hardware_bytes else {"gpu": "H100"}

    def one(_i: int) -> None:
        nonlocal retry_after
        key = generate_key()
        try:
            r = _post(http, key, "/v1/nodes/register", {"hardware": hardware, "throughput": throughput,
                                                        "stake": stake})
        except httpx.HTTPError as e:
            with lock:
                refused[type(e).__name__] += 1
            return
        if r.status_code != 200:
            with lock:
                refused[str(r.status_code)] += 1
                ra = r.headers.get("retry-after", "")
                retry_after = max(retry_after, float(ra) if ra.isdigit() else 0.0)
            return
        beat = _post(http, key, "/v1/nodes/heartbeat", {}) if heartbeat else None
        with lock:
            counts["registered"] += 1
            if beat is not None and beat.status_code == 200:
                counts["heartbeats"] += 1
                counts["assignments"] += len(beat.json()["assignments"])

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    with httpx.Client(base_url=url.rstrip("/"), timeout=timeout, limits=limits) as http:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(one, range(n)))
        dt = time.perf_counter() - t0
    return {"attempted": n, **counts, "refused": dict(sorted(refused.items())), "seconds": round(dt, 3),
            "attempts_per_s": round(n / dt, 1), "registered_per_s": round(counts["registered"] / dt, 1),
            "max_retry_after_s": retry_after}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orchestrator", required=True, help="orchestrator URL, e.g. http://127.0.0.1:8700")
    ap.add_argument("--n", type=int, default=300, help="fresh keys to register")
    ap.add_argument("--stake", type=float, default=100.0, help="stake each sybil claims")
    ap.add_argument("--throughput", type=float, default=10.0)
    ap.add_argument("--hardware-bytes", type=int, default=0, help="pad the hardware field with this many bytes")
    ap.add_argument("--heartbeat", action="store_true", help="heartbeat once with each registered key, then go idle")
    ap.add_argument("--concurrency", type=int, default=1, help="parallel connections")
    a = ap.parse_args()
    print(json.dumps(flood(a.orchestrator, a.n, stake=a.stake, throughput=a.throughput,
                           hardware_bytes=a.hardware_bytes, heartbeat=a.heartbeat, concurrency=a.concurrency)))


if __name__ == "__main__":
    main()
