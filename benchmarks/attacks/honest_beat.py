"""Does an honest node's signed heartbeat keep its latency while others hold N idle connections?

For each server tree (``--base DIR`` first, e.g. an older checkout, then this one): start a real orchestrator
(``python -m swarmrl orchestrator serve``, tmp data dir, free loopback port, that tree on PYTHONPATH), register one
node from 127.0.0.1 and time ``--beats`` signed heartbeats with ``NodeClient`` before the attack, each on a fresh
connection (as a node beating every 10 s does: the keep-alive connection is gone by then); then start
``idle_conns.py`` holding ``--conns`` half-sent connections from other loopback addresses (127.0.0.2, ...,
``--per-address`` each) and once they are held time ``--beats`` more. A heartbeat that fails or takes longer than
``--timeout`` counts as a failure and, in the percentiles, as ``--timeout`` seconds. The attack is judged as the
swarm report judges the ``idle_connections`` adversary (``swarmrl.job.report``): ``held`` if no beat failed during
it and the median during it is at most HELD_FACTOR x the median before + HELD_SLACK_S.
Prints one JSON line per server: idle_conns (what the attacker tried and kept), honest_beat_before_p50_s / _p99_s,
honest_beat_p50_s / _p99_s (during), honest_beat_failures, held.

    python benchmarks/attacks/honest_beat.py --conns 20000 --beats 100 --base /tmp/base

Bounded: the attacker stops after ``--attack-seconds`` at most (or as soon as the beats are done), the beats after
``--beat-window-s``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from swarmrl.job.report import HELD_FACTOR, HELD_SLACK_S  # noqa: E402
from swarmrl.protocol.client import ApiError, AuthorityClient, NodeClient, wait_until_up  # noqa: E402
from swarmrl.protocol.schemas import HeartbeatRequest, RegisterRequest  # noqa: E402
from swarmrl.protocol.signing import generate_key, public_key_hex  # noqa: E402

ATTACK = Path(__file__).with_name("idle_conns.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))], 4)


def _read_ready(proc: subprocess.Popen, timeout: float) -> dict:
    """Wait for the attacker's ``ready`` line on stderr."""
    end = time.monotonic() + timeout
    os.set_blocking(proc.stderr.fileno(), False)
    buf = b""
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"attacker exited early: {buf.decode(errors='replace')[-2000:]}")
        chunk = proc.stderr.read()
        if chunk:
            buf += chunk
            for line in buf.splitlines():
                if line.startswith(b'{"event": "ready"'):
                    return json.loads(line)
        time.sleep(0.05)
    raise RuntimeError("attacker not ready in time")


def time_beats(url: str, key, a: argparse.Namespace) -> tuple[list[float], int, dict[str, int]]:  # noqa: ANN001
    """``--beats`` signed heartbeats, each on a fresh connection, within ``--beat-window-s``: latencies (a failure
    as ``--timeout``), failures, error kinds."""
    lat, failures, errors = [], 0, {}
    end = time.monotonic() + a.beat_window_s
    for _ in range(a.beats):
        if time.monotonic() > end:
            break
        t0 = time.perf_counter()
        try:
            with NodeClient(url, key, timeout=a.timeout) as c:
                c.request("POST", "/v1/nodes/heartbeat", HeartbeatRequest())
            dt = time.perf_counter() - t0
            ok = dt <= a.timeout
        except (httpx.HTTPError, ApiError, OSError) as e:
            dt, ok = a.timeout, False
            errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
        lat.append(min(dt, a.timeout))
        failures += not ok
        time.sleep(a.interval_s)
    return lat, failures, errors


def run_one(tree: Path, label: str, a: argparse.Namespace) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="honest-beat-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    log = open(tmp / "orchestrator.log", "wb")
    sets = ["rate_limit_per_s=1000", "rate_limit_burst=1000"]
    authority = generate_key()
    deposits = "stake_authority_keys" in (tree / "swarmrl" / "protocol" / "config.py").read_text()
    if deposits:  # a tree where stake is a deposit: this run's authority deposits the honest node's stake
        sets.append(f"stake_authority_keys=['{public_key_hex(authority)}']")
    server = subprocess.Popen([sys.executable, "-m", "swarmrl", "orchestrator", "serve", "--port", str(port),
                               "--data-dir", str(tmp / "orch"), *(x for kv in sets for x in ("--set", kv))],
                              cwd=tree, env=env, stdout=log, stderr=log)
    attacker = None
    try:
        wait_until_up(url, server, timeout=60)
        key = generate_key()
        if deposits:
            with AuthorityClient(url, authority, timeout=a.timeout) as auth:
                auth.deposit(100.0, public_key=public_key_hex(key))
        with NodeClient(url, key, timeout=a.timeout) as c:  # replies not parsed: an older server's differ
            c.request("POST", "/v1/nodes/register", RegisterRequest(throughput=100.0, stake=100.0))
        before, before_failures, _ = time_beats(url, key, a)
        attacker = subprocess.Popen([sys.executable, str(ATTACK), "--url", url, "--conns", str(a.conns),
                                     "--seconds", str(a.attack_seconds), "--per-address", str(a.per_address),
                                     "--reconnect-per-s", str(a.reconnect_per_s)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        ready = _read_ready(attacker, 180)
        time.sleep(a.settle_s)  # the server accepts (and sheds) what queued up
        lat, failures, errors = time_beats(url, key, a)
        attacker.send_signal(signal.SIGTERM)
        out, _ = attacker.communicate(timeout=120)
        idle = json.loads(out.decode().strip().splitlines()[-1])
        held = failures == 0 and pct(lat, 0.5) <= HELD_FACTOR * pct(before, 0.5) + HELD_SLACK_S
        return {"server": label, "tree": str(tree), "conns": a.conns, "idle_conns": idle,
                "held_when_beats_started": ready.get("open_at_end"),
                "honest_beat_before_p50_s": pct(before, 0.5), "honest_beat_before_p99_s": pct(before, 0.99),
                "honest_beat_before_failures": before_failures, "held": held,
                "bound": f"no failure during, p50 during <= {HELD_FACTOR:g} x p50 before + {HELD_SLACK_S:g} s",
                "honest_beat_p50_s": pct(lat, 0.5), "honest_beat_p99_s": pct(lat, 0.99),
                "honest_beat_max_s": round(max(lat), 4), "honest_beat_failures": failures, "beats": len(lat),
                "errors": errors, "timeout_s": a.timeout,
                "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE))}
    finally:
        if attacker is not None and attacker.poll() is None:
            attacker.kill()
            attacker.wait()
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conns", type=int, default=20000)
    ap.add_argument("--beats", type=int, default=100)
    ap.add_argument("--interval-s", type=float, default=0.05)
    ap.add_argument("--timeout", type=float, default=2.0, help="a heartbeat slower than this is a failure")
    ap.add_argument("--per-address", type=int, default=50)
    ap.add_argument("--reconnect-per-s", type=float, default=500.0)
    ap.add_argument("--settle-s", type=float, default=2.0)
    ap.add_argument("--attack-seconds", type=float, default=300.0)
    ap.add_argument("--beat-window-s", type=float, default=150.0)
    ap.add_argument("--base", type=Path, default=None, help="also run this older tree first (same N)")
    a = ap.parse_args()
    for tree, label in ([(a.base, "base")] if a.base else []) + [(ROOT, "this")]:
        print(json.dumps(run_one(tree.resolve(), label, a)), flush=True)


if __name__ == "__main__":
    main()
