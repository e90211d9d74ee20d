"""Slowloris and connection hoarding against the public servers (issue "Hostile outsiders", item 4).

Real servers run as their CLI commands in child processes on 127.0.0.1, some with a small open-files limit
(``ulimit -n 400``) so that a few hundred held connections exhaust it as ~20k do on a default machine. The
attacker holds half-sent requests from other loopback addresses (127.0.0.2 and up, each its own "peer"); the
honest client uses 127.0.0.1. Outcomes only: status codes and which sockets the server closed.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from swarmrl.attacks.slowloris import HoldReport, IdleHolder, hold_idle_connections, loopback_sources, raise_own_nofile
from swarmrl.protocol.client import NodeClient
from swarmrl.protocol.signing import generate_key
from swarmrl.shardcast.signing import generate_key as origin_key
from swarmrl.shardcast.signing import public_key_hex as origin_pub
from swarmrl.utils.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
NOFILE = 400  # the servers' open-files limit in the load tests
CAPS = ["max_connections=200", "max_connections_per_ip=8", "reserved_connections=20"]
SHORT = ["header_timeout_s=1", "idle_timeout_s=1"]


def _low_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


@contextmanager
def _process(args: list[str], url: str, ready_path: str, low_nofile: bool, log: Path) -> Iterator[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with open(log, "wb") as out:
        p = subprocess.Popen([sys.executable, "-m", "swarmrl", *args], cwd=ROOT, env=env, stdout=out, stderr=out,
                             preexec_fn=_low_nofile if low_nofile else None)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert p.poll() is None, f"server exited: {log.read_text()[-2000:]}"
            try:
                if httpx.get(url + ready_path, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.1)
        yield url
    finally:
        p.terminate()
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def orchestrator(tmp: Path, sets: list[str], low_nofile: bool = False):  # noqa: ANN201
    port = free_port()
    args = ["orchestrator", "serve", "--port", str(port), "--data-dir", str(tmp / f"orch{port}")]
    # the stake model is not what is tested here: nodes lock the stake they claim
    for s in ["rate_limit_per_s=1000", "rate_limit_burst=1000", "self_declared_stake=true", *sets]:
        args += ["--set", s]
    return _process(args, f"http://127.0.0.1:{port}", "/v1/health", low_nofile, tmp / f"orch{port}.log")


def origin(tmp: Path, sets: list[str], low_nofile: bool = False):  # noqa: ANN201
    port = free_port()
    args = ["shardcast", "origin", "--dir", str(tmp / f"origin{port}"), "--port", str(port)]
    for s in sets:
        args += ["--set", s]
    return _process(args, f"http://127.0.0.1:{port}", "/distribution.txt", low_nofile, tmp / f"origin{port}.log")


def relay(tmp: Path, upstream: str, sets: list[str]):  # noqa: ANN201
    port = free_port()
    args = ["shardcast", "relay", "--upstream", upstream, "--dir", str(tmp / f"relay{port}"), "--port", str(port),
            "--origin-pubkey", origin_pub(origin_key())]
    for s in sets:
        args += ["--set", s]
    return _process(args, f"http://127.0.0.1:{port}", "/distribution.txt", False, tmp / f"relay{port}.log")


# ---- raw sockets -------------------------------------------------------------------------------------------
def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _connect(url: str, source: str, send: bytes) -> socket.socket:
    s = socket.socket()
    s.settimeout(10)
    s.bind((source, 0))
    s.connect(("127.0.0.1", _port(url)))
    if send:
        s.sendall(send)
    return s


def _outcome(s: socket.socket, wait_s: float) -> str:
    """What the server did with a held connection within wait_s: 'refused' (answered 503 and closed),
    'closed' (closed without answering), 'answered' (another response) or 'open'."""
    s.settimeout(wait_s)
    try:
        data = s.recv(4096)
    except TimeoutError:
        return "open"
    except ConnectionResetError:
        return "closed"
    if not data:
        return "closed"
    return "refused" if data.startswith(b"HTTP/1.1 503") else "answered"


def _closed_within(s: socket.socket, wait_s: float, trickle: bytes = b"") -> bool:
    """Whether the server closes ``s`` within wait_s while we trickle one more byte (of a header value, or of
    the body) every 0.2 s: a deadline on the whole head or body, not on each read."""
    end = time.monotonic() + wait_s
    s.settimeout(0.2)
    while time.monotonic() < end:
        try:
            data = s.recv(4096)
            if not data:
                return True
            continue  # an answer (e.g. 408): the close follows
        except TimeoutError:
            pass
        except ConnectionResetError:
            return True
        if trickle:
            try:
                s.sendall(trickle)
            except OSError:
                return True
    return False


def _per_address_cap(url: str, cap: int, source: str) -> None:
    socks = [_connect(url, source, b"GET /v1/ping HT") for _ in range(cap + 4)]
    try:
        outcomes = [_outcome(s, 3.0 if i >= cap else 0.5) for i, s in enumerate(socks)]
    finally:
        for s in socks:
            s.close()
    assert outcomes.count("refused") == 4, outcomes
    assert outcomes[:cap].count("refused") == 0, outcomes


@contextmanager
def _idle_attack(url: str, n: int, first_source: int) -> Iterator[HoldReport]:
    """Hold n half-sent connections from n/8 loopback addresses (at the per-address cap) until the block ends."""
    stop, ready, out = threading.Event(), threading.Event(), []
    sources = loopback_sources(n // 8, first=first_source)
    t = threading.Thread(target=lambda: out.append(hold_idle_connections(
        [("127.0.0.1", _port(url))], n, 120, sources=sources, stop=stop, on_ready=lambda _r: ready.set())),
        daemon=True)
    t.start()
    assert ready.wait(30)
    time.sleep(1.0)  # let the server accept (and shed) the backlog
    try:
        yield out
    finally:
        stop.set()
        t.join(30)


# ---- orchestrator -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def loaded_orchestrator(tmp_path_factory) -> Iterator[str]:  # noqa: ANN001
    """Small caps, long deadlines, 400 open files."""
    with orchestrator(tmp_path_factory.mktemp("orch"), [*CAPS, "header_timeout_s=60"], low_nofile=True) as url:
        yield url


def test_orchestrator_refuses_connections_beyond_the_per_address_cap(loaded_orchestrator: str) -> None:
    _per_address_cap(loaded_orchestrator, 8, "127.0.0.50")


@pytest.fixture(scope="module")
def strict_orchestrator(tmp_path_factory) -> Iterator[str]:  # noqa: ANN001
    """One-second deadlines."""
    with orchestrator(tmp_path_factory.mktemp("orch"), [*SHORT, "body_timeout_s=1"]) as url:
        yield url


@pytest.mark.parametrize("case", ["head", "head_after_keepalive", "body"])
def test_orchestrator_closes_a_slow_request_at_its_deadline(strict_orchestrator: str, case: str) -> None:
    """Whole-head and whole-body deadlines: trickling a byte every 0.2 s does not keep a request alive."""
    url = strict_orchestrator
    if case == "head":
        s = _connect(url, "127.0.0.60", b"GET /v1/ping HTTP/1.1\r\nHost: x\r\nX-Pad: ")
    elif case == "head_after_keepalive":
        s = _connect(url, "127.0.0.61", b"GET /v1/ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        s.sendall(b"GET /v1/ping HTTP/1.1\r\nHost: x\r\nX-Pad: ")
    else:
        s = _connect(url, "127.0.0.62", b"POST /v1/nodes/heartbeat HTTP/1.1\r\nHost: x\r\n"
                                        b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"st")
    with s:
        assert _closed_within(s, 15.0, trickle=b"a")


def test_orchestrator_answers_an_honest_heartbeat_under_idle_connections(loaded_orchestrator: str) -> None:
    url = loaded_orchestrator
    key = generate_key()
    with NodeClient(url, key) as c:  # registering (signed, accepted) makes 127.0.0.1 trusted
        c.register(throughput=100.0, stake=100.0)
    with _idle_attack(url, 480, first_source=256):  # 480 half-sent connections from 60 addresses
        for _ in range(5):
            with NodeClient(url, key, timeout=10) as c:  # a fresh connection each time
                assert c.heartbeat().assignments is not None
        # an address that never authenticated finds only the reserved connections left: refused at once
        with _connect(url, "127.0.0.70", b"") as s:
            assert _outcome(s, 5.0) == "refused"


# ---- SHARDCAST ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def loaded_origin(tmp_path_factory) -> Iterator[str]:  # noqa: ANN001
    with origin(tmp_path_factory.mktemp("origin"), [*CAPS, "header_timeout_s=60"], low_nofile=True) as url:
        yield url


def test_shardcast_refuses_connections_beyond_the_per_address_cap(loaded_origin: str) -> None:
    _per_address_cap(loaded_origin, 8, "127.0.0.80")


@pytest.fixture(scope="module")
def strict_relay(tmp_path_factory) -> Iterator[str]:  # noqa: ANN001
    """A relay with one-second deadlines (its upstream an origin with the defaults)."""
    tmp = tmp_path_factory.mktemp("relay")
    with origin(tmp, []) as up, relay(tmp, up, SHORT) as url:
        yield url


@pytest.mark.parametrize("case", ["head", "head_after_keepalive"])
def test_shardcast_relay_closes_a_slow_request_head_at_its_deadline(strict_relay: str, case: str) -> None:
    url = strict_relay
    if case == "head":
        s = _connect(url, "127.0.0.90", b"GET /distribution.txt HTTP/1.1\r\nHost: x\r\nX-Pad: ")
    else:
        s = _connect(url, "127.0.0.91", b"GET /distribution.txt HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        s.sendall(b"GET /distribution.txt HTTP/1.1\r\nHost: x\r\nX-Pad: ")
    with s:
        assert _closed_within(s, 15.0, trickle=b"a")


def test_shardcast_answers_an_honest_client_under_idle_connections(loaded_origin: str) -> None:
    url = loaded_origin
    assert httpx.get(url + "/distribution.txt", timeout=10).status_code == 200  # a success makes 127.0.0.1 trusted
    with _idle_attack(url, 480, first_source=1024):
        for _ in range(5):
            assert httpx.get(url + "/distribution.txt", timeout=10).status_code == 200
        with _connect(url, "127.0.0.100", b"") as s:
            assert _outcome(s, 5.0) == "refused"


# ---- the idle_connections adversary's engine --------------------------------------------------------------
def test_idle_connections_adversary_is_bounded_and_shed_by_both_servers(strict_orchestrator: str,
                                                                        strict_relay: str) -> None:
    """What the ``idle_connections`` node runs in the background: a fixed number of connections per server, one
    round, everything closed at the end; the one-second deadlines close all of them first."""
    holder = IdleHolder(lambda: [strict_orchestrator, strict_relay], per_target=12, round_s=6.0,
                        reconnect_per_s=0.0, sources=["127.0.0.66"]).start()
    deadline = time.monotonic() + 30
    while holder.rounds < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    total = holder.stop()
    rep = holder.first
    assert rep is not None and rep.attempted == 24 and rep.connected == 24, rep
    assert rep.closed_by_server == 24 and rep.open_at_end == 0, rep
    assert total.attempted <= 24 * holder.rounds, total


@pytest.fixture(scope="module")
def default_orchestrator(tmp_path_factory) -> Iterator[str]:  # noqa: ANN001
    """The shipped connection limits (64 per address, 10 s head deadline)."""
    with orchestrator(tmp_path_factory.mktemp("orch"), []) as url:
        yield url


def test_idle_connections_adversary_is_not_shed_by_the_per_address_cap(default_orchestrator: str) -> None:
    """At full strength: the adversary's default connections, from its default source addresses (hundreds on
    loopback), against the shipped limits. None is refused by the per-address cap (or any other cap: no 503)
    and all of them are held at once; what meets them is the deadlines and the global cap with its reserve.
    (From one address, as before, all but 64 of them were refused at once.)"""
    from swarmrl.attacks.adversaries import idle_sources  # noqa: PLC0415  # lazy: torch
    from swarmrl.attacks.config import AdversaryConfig  # noqa: PLC0415

    cfg = AdversaryConfig(adversary="idle_connections", orchestrator=default_orchestrator)
    sources = idle_sources(cfg)
    assert sources is not None and len(sources) >= 100 and "127.0.0.1" not in sources
    assert -(-cfg.idle_conns // len(sources)) < 64  # per address and server, under the shipped cap
    if raise_own_nofile(4096) < 4096:  # the server (same limit) would meet them with its global cap instead
        pytest.skip("open-files limit under 4096: the server's global cap would be what sheds them")
    rep = hold_idle_connections([("127.0.0.1", _port(default_orchestrator))], cfg.idle_conns, 4.0, sources=sources)
    assert rep.connected == cfg.idle_conns and rep.refused_503 == 0, rep
    assert rep.peak_open == cfg.idle_conns, rep  # every one held at once (the head deadline is 10 s)


def _run_with_attack(root: Path, honest_calls: list[tuple[str, float, float, bool]],
                     windows: list[tuple[float, float]]) -> dict:
    """A run dir with one honest node's timed calls ``(call, start, seconds, ok)`` and an idle_connections node's
    rounds over ``windows``; its report for both (the orchestrator is not there: ledgers read as unknown)."""
    from swarmrl.job.report import swarm_report  # noqa: PLC0415
    from swarmrl.rundir import RunLayout  # noqa: PLC0415
    from swarmrl.utils.metrics import MetricsWriter  # noqa: PLC0415

    layout = RunLayout(root)
    with MetricsWriter(layout.role_metrics("node", "honest")) as m:
        for call, start, s, ok in honest_calls:
            m.write(event="call", call=call, s=s, ok=ok, time=start)
    with MetricsWriter(layout.role_metrics("idle", "attacker")) as m:
        for start, end in windows:
            m.write(event="idle_round", start=start, end=end, addresses=256, attempted=2048, connected=2048,
                    connect_failed=0, closed_by_server=2048, refused_503=0, peak_open=2048, open_at_end=0,
                    seconds=end - start)
    members = {"n0": {"node_id": "honest", "adversary": ""},
               "x0-idle_connections": {"node_id": "attacker", "adversary": "idle_connections"}}
    return swarm_report(root, f"http://127.0.0.1:{free_port()}", members)["nodes"]["x0-idle_connections"]


def _calls(t0: float, t1: float, beat_s: float, upload_s: float, ok: bool = True) -> list:
    """A heartbeat every 0.5 s and an upload every 2 s from t0 to t1."""
    beats = [("heartbeat", t0 + 0.5 * i, beat_s, ok) for i in range(int((t1 - t0) / 0.5))]
    return beats + [("upload", t0 + 2.0 * i + 0.25, upload_s, True) for i in range(int((t1 - t0) / 2.0))]


@pytest.mark.parametrize("during", ["kept", "slowed", "unserved", "no_rounds"])
def test_idle_connections_attack_is_judged_by_the_honest_nodes_latency(tmp_path: Path, during: str) -> None:
    """``held`` (and so ``caught``) is whether the honest nodes' heartbeats and uploads kept their latency during
    the attack's rounds, not whether the servers closed some of its connections (they always do): 10 s quiet,
    then a 20 s round, 10 s quiet again."""
    from swarmrl.job.report import HELD_FACTOR, summary_lines  # noqa: PLC0415

    t = 1_000_000.0
    windows = [] if during == "no_rounds" else [(t + 10, t + 30)]
    quiet = _calls(t, t + 10, 0.012, 0.041) + _calls(t + 30, t + 40, 0.012, 0.041)
    slow = {"kept": (0.013, 0.044, True), "slowed": (0.5, 0.041 * HELD_FACTOR + 0.2, True),
            "unserved": (0.013, 0.044, False), "no_rounds": (0.013, 0.044, True)}[during]
    n = _run_with_attack(tmp_path / "run", quiet + _calls(t + 10, t + 30, *slow), windows)
    lat = n["honest_latency"]
    if during == "no_rounds":  # nothing to judge: not held (the attack did not happen)
        assert n["held"] is False and n["caught"] is False and n["idle_rounds"] == 0, n
        return
    assert lat["heartbeat"]["quiet_n"] == 40 and lat["heartbeat"]["during_n"] == 40, lat
    assert lat["upload"]["quiet_p50_s"] == 0.041 and n["idle_addresses"] == 256 and n["idle_closed_by_server"] > 0
    assert n["held"] is (during == "kept") and n["caught"] is n["held"], n
    if during == "unserved":
        assert lat["heartbeat"]["during_unserved"] == 40 and lat["heartbeat"]["held"] is False, lat
    s = {"run_dir": "runs/rl", "final_model": "m", "curves": "c", "steps": 1, "wall_s": 1.0,
         "heldout_acc_initial": 0.1, "heldout_acc_final": 0.2, "heldout_n": 8, "async_level": 1,
         "trainer_wait_frac": 0.1, "mean_lag": 0.5,
         "swarm": {"totals": {}, "nodes": {"x12-idle_connections": n}}}
    lines = summary_lines(s)
    i = next(i for i, ln in enumerate(lines) if "idle_connections" in ln)
    assert all(len(ln) <= 78 for ln in lines), lines
    assert lines[i].endswith("x12-idle_connections: held" if during == "kept" else ": NOT held"), lines
    if during == "kept":
        assert lines[i + 1].strip() == "honest p50 ms beat 12->13, upload 41->44 (outside->during)", lines
