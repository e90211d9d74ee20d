"""The heartbeat hot path: steady-state heartbeats answered from the in-memory mirror with their writes
group-committed before the reply. It must answer exactly what the full (database) path answers, see every state
change made by other paths at the node's next heartbeat, refuse replays (also across a restart), and shed load
with 503 + Retry-After instead of timing out; a database failure never counts against the node."""

from __future__ import annotations

import concurrent.futures
import hashlib
import threading
import time

import httpx
import pytest
from protocol_support import make_cfg, rollouts_for, running, write
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from swarmrl.protocol.client import ApiError, NodeClient
from swarmrl.protocol.orchestrator.auth import SignedRequest
from swarmrl.protocol.orchestrator.errors import Principal, ProtocolError
from swarmrl.protocol.orchestrator.service import Orchestrator
from swarmrl.protocol.schemas import (
    CheckResult,
    HeartbeatReply,
    HeartbeatRequest,
    RegisterRequest,
    StepRequest,
    VerdictRequest,
)
from swarmrl.protocol.signing import body_sha256, generate_key, node_id_for, public_key_hex, sign_request
from swarmrl.protocol.tables import Node, Nonce

PATH = "/v1/nodes/heartbeat"
BODY = HeartbeatRequest().model_dump_json().encode()


@pytest.fixture()
def service(tmp_path):
    cfg, keys = make_cfg(tmp_path)  # SQLite, or the PostgreSQL server of SWARMRL_TEST_DATABASE_URL
    orch = Orchestrator(cfg)
    try:
        yield orch, cfg, keys
    finally:
        orch.close()


def join(orch: Orchestrator):  # noqa: ANN201
    key = generate_key()
    pub = public_key_hex(key)
    p = Principal(node_id_for(pub), pub, "worker", "0" * 64)
    orch.membership.register(p, RegisterRequest(throughput=10.0, stake=100.0))
    return key, p


def beat(orch: Orchestrator, key, headers: dict | None = None, now: float | None = None) -> tuple[str, HeartbeatReply]:  # noqa: ANN001
    """One signed heartbeat as the HTTP layer runs it: the hot path, else the full path with the verified headers."""
    headers = headers or sign_request(key, "POST", PATH, BODY)
    call = SignedRequest("POST", PATH, headers, body_sha256(BODY))
    h, done, reply = orch.hot_path.answer(call, BODY, now=now)
    if done is None:
        return "full", orch.assignments.signed_heartbeat(call, HeartbeatRequest(), now=now, verified=h)
    if not done.result(timeout=10):
        raise ProtocolError(401, "replayed nonce")
    return "fast", HeartbeatReply.model_validate_json(reply)


def test_steady_heartbeat_is_answered_from_memory_and_matches_the_full_path(service):
    orch, _, _ = service
    key, p = join(orch)
    how, first = beat(orch, key)
    assert how == "full" and len(first.assignments) == 1  # the first beat makes the assignment
    written = orch.hot_path.beat_writer.written
    t = time.time() + 1.0
    how, second = beat(orch, key, now=t)
    assert how == "fast"
    assert second == first  # the very same answer, field by field
    assert orch.hot_path.beat_writer.written == written + 1
    with orch.db.tx() as s:  # committed before the reply: liveness and the nonce
        assert s.get(Node, p.node_id).last_heartbeat == t
        assert s.execute(select(Nonce).where(Nonce.public_key == p.public_key)).all()
    # the hot path off: the same answer from the database
    orch.hot_path.enabled = False
    how, third = beat(orch, key)
    assert how == "full" and third == first


def test_replay_is_refused_in_memory_and_after_a_restart(service, tmp_path):
    orch, cfg, _ = service
    key, _ = join(orch)
    beat(orch, key)
    headers = sign_request(key, "POST", PATH, BODY)
    assert beat(orch, key, headers)[0] == "fast"
    with pytest.raises(ProtocolError) as e:
        beat(orch, key, headers)
    assert e.value.status == 401 and e.value.detail == "replayed nonce"
    orch.close()
    again = Orchestrator(cfg)  # a restart: the nonces come back from the database, the mirror is rebuilt
    try:
        assert len(again.mirror.nodes) == 1
        with pytest.raises(ProtocolError) as e:
            beat(again, key, headers)
        assert e.value.status == 401 and e.value.detail == "replayed nonce"
        assert beat(again, key)[0] == "fast"  # known node, answered from memory straight after the restart
    finally:
        again.close()


def test_changes_made_elsewhere_reach_the_next_heartbeat(service, tmp_path):
    orch, cfg, keys = service
    key, p = join(orch)
    other_key, other = join(orch)
    a = beat(orch, key)[1].assignments[0]
    beat(orch, other_key)
    assert beat(orch, key)[0] == "fast"
    # an upload: the work is no longer listed
    path = write(rollouts_for(p.node_id, a), tmp_path / "r.parquet")
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    orch.submissions.accept_upload(Principal(p.node_id, p.public_key, "worker", sha), a.assignment_id, path, sha, len(data))
    how, r = beat(orch, key)
    assert how == "full" and r.assignments == []
    assert beat(orch, key) == ("fast", r)
    # a new step: new work, made by the full path, then served from memory
    orch.run.set_step(StepRequest(step=1, policy_version=1))
    how, r = beat(orch, key)
    assert how == "full" and [x.step for x in r.assignments] == [1] and r.policy_version == 1
    assert beat(orch, key) == ("fast", r)
    # a node swept dead: its work goes to the live node, whose next beat must take it (not the memory answer)
    t = time.time() + cfg.heartbeat_interval_s * cfg.dead_after_missed + 5
    beat(orch, other_key, now=t - 1)
    assert orch.membership.sweep(now=t) == [p.node_id]
    assert p.node_id not in orch.mirror.nodes  # a dead node is never answered from memory
    how, r = beat(orch, other_key, now=t + 1)
    assert how == "full" and [x.reassigned_from for x in r.assignments].count(p.node_id) == 1
    # the dead node comes back through the full path (revived)
    assert beat(orch, key, now=t + 2)[0] == "full"
    assert orch.membership.node_info(p.node_id).status == "active"
    # an ejection: the next heartbeat is refused, not answered from memory
    b = next(x for x in beat(orch, other_key, now=t + 3)[1].assignments if x.step == 1 and not x.reassigned_from)
    path = write(rollouts_for(other.node_id, b, correct=False, forge_rewards=True), tmp_path / "f.parquet")
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    sub = orch.submissions.accept_upload(Principal(other.node_id, other.public_key, "worker", sha), b.assignment_id, path, sha,
                             len(data))
    assert beat(orch, other_key, now=t + 4)[0] in ("full", "fast")
    vp = Principal(node_id_for(public_key_hex(keys["validator"])), public_key_hex(keys["validator"]), "validator", "")
    orch.verdicts.verdict(vp, VerdictRequest(submission_id=sub.submission_id, accepted=False, reason="forged",
                                    checks=[CheckResult(name="rewards", ok=False, reason="forged")]))
    with pytest.raises(ProtocolError) as e:
        beat(orch, other_key, now=t + 5)
    assert e.value.status == 403


def test_database_failure_is_a_503_and_never_the_nodes_fault(service):
    orch, _, _ = service
    key, p = join(orch)
    beat(orch, key)

    def broken(beats):  # noqa: ANN001, ANN202
        raise OperationalError("INSERT", {}, Exception("disk I/O error"))

    real, orch.hot_path.beat_writer._write = orch.hot_path.beat_writer._write, broken
    h, done, _ = orch.hot_path.answer(SignedRequest("POST", PATH, sign_request(key, "POST", PATH, BODY), body_sha256(BODY)),
                                      BODY)
    with pytest.raises(OperationalError):
        done.result(timeout=10)
    orch.hot_path.beat_writer._write = real
    assert orch.membership.node_info(p.node_id).status == "active"
    assert beat(orch, key)[0] == "fast"


def _post(url: str, key) -> httpx.Response:  # noqa: ANN001
    h = sign_request(key, "POST", PATH, BODY)
    h["Content-Type"] = "application/json"
    return httpx.post(url + PATH, content=BODY, headers=h, timeout=30)


def test_http_hot_path_answers_and_sheds_load_with_503(tmp_path):
    cfg, _ = make_cfg(tmp_path, max_heartbeat_queue=2, max_full_heartbeats=1)
    with running(cfg) as srv:
        keys = [generate_key() for _ in range(6)]
        for k in keys:
            with NodeClient(srv.url, k) as c:
                c.register(throughput=10.0, stake=100.0)
                first = c.heartbeat()
        with NodeClient(srv.url, keys[-1]) as c:
            assert c.heartbeat() == first  # through the hot path over HTTP
        # replay over HTTP: the same signed request twice
        h = sign_request(keys[0], "POST", PATH, BODY)
        h["Content-Type"] = "application/json"
        assert httpx.post(srv.url + PATH, content=BODY, headers=h).status_code == 200
        r = httpx.post(srv.url + PATH, content=BODY, headers=h)
        assert r.status_code == 401 and r.json()["detail"] == "replayed nonce"

        # a stalled database: the writer holds each batch 0.5 s; 12 beats at once overflow the 2-beat queue
        gate = threading.Event()
        real = srv.orch.hot_path.beat_writer._write

        def slow(beats):  # noqa: ANN001, ANN202
            gate.wait(0.5)
            return real(beats)

        srv.orch.hot_path.beat_writer._write = slow
        with concurrent.futures.ThreadPoolExecutor(12) as ex:
            rs = list(ex.map(lambda i: _post(srv.url, keys[i % len(keys)]), range(12)))  # each answered
        srv.orch.hot_path.beat_writer._write = real
        codes = sorted(r.status_code for r in rs)
        assert 200 in codes and 503 in codes, codes
        assert set(codes) <= {200, 503}
        shed = [r for r in rs if r.status_code == 503]
        assert all(int(r.headers["retry-after"]) >= 1 for r in shed)
        assert "overloaded" in shed[0].json()["detail"]
        # the client surfaces the Retry-After
        with NodeClient(srv.url, keys[0]) as c:
            srv.orch.hot_path.beat_writer._write = slow
            try:
                with concurrent.futures.ThreadPoolExecutor(8) as ex:
                    futs = [ex.submit(c.heartbeat) for _ in range(8)]
                    errs = [f.exception() for f in futs]
            finally:
                srv.orch.hot_path.beat_writer._write = real
            busy = [e for e in errs if isinstance(e, ApiError)]
            assert busy and all(e.status == 503 and e.retry_after >= 1 for e in busy)
