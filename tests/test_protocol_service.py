"""The orchestrator service driven directly, with no HTTP: registration, seeded assignments, sweeping and
reassignment, nonce replay, rejection with slashing and ejection; and the service importing no HTTP stack."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from pathlib import Path

import pytest
from protocol_support import make_cfg, rollouts_for, write

from swarmrl.contract import assigned_tasks, task_seed
from swarmrl.protocol.orchestrator import ledger
from swarmrl.protocol.orchestrator.auth import SignedRequest
from swarmrl.protocol.orchestrator.errors import Principal, ProtocolError
from swarmrl.protocol.orchestrator.service import Orchestrator
from swarmrl.protocol.schemas import CheckResult, HeartbeatRequest, RegisterRequest, VerdictRequest
from swarmrl.protocol.signing import body_sha256, generate_key, node_id_for, public_key_hex, sign_request
from swarmrl.protocol.tables import Assignment

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def service(tmp_path):
    cfg, keys = make_cfg(tmp_path, database_url="")  # SQLite file under tmp_path
    orch = Orchestrator(cfg)
    try:
        yield orch, cfg, keys
    finally:
        orch.db.dispose()


def worker(key) -> Principal:  # noqa: ANN001
    pub = public_key_hex(key)
    return Principal(node_id_for(pub), pub, "worker", "0" * 64)


def join(orch: Orchestrator, stake: float = 100.0, throughput: float = 10.0, now: float | None = None) -> Principal:
    p = worker(generate_key())
    orch.membership.register(p, RegisterRequest(throughput=throughput, stake=stake), now=now)
    return p


def test_register_then_heartbeat_gets_seeded_assignment(service):
    orch, cfg, _ = service
    key = generate_key()
    body = RegisterRequest(throughput=10.0, stake=150.0).model_dump_json().encode()
    path = "/v1/nodes/register"
    p = orch.auth.authenticate(SignedRequest("POST", path, sign_request(key, "POST", path, body), body_sha256(body)),
                               ("worker",), allow_unregistered=True)
    assert p.node_id == node_id_for(public_key_hex(key)) and p.role == "worker"
    assert p.content_sha256 == body_sha256(body)
    with pytest.raises(ProtocolError) as e:
        orch.membership.register(p, RegisterRequest(throughput=10.0, stake=cfg.min_stake - 1))
    assert e.value.status == 422
    reg = orch.membership.register(p, RegisterRequest(throughput=10.0, stake=150.0))
    assert reg.node_id == p.node_id and reg.stake_locked == 150.0
    assert orch.ledger.balance(p.node_id).stake == 150.0
    with pytest.raises(ProtocolError) as e:
        orch.membership.register(p, RegisterRequest(throughput=10.0, stake=150.0))
    assert e.value.status == 409

    hb = orch.assignments.heartbeat(p, HeartbeatRequest())
    assert hb.node_id == p.node_id and hb.step == 0 and len(hb.assignments) == 1
    a = hb.assignments[0]
    assert a.seed == task_seed(p.node_id, 0, cfg.run_secret) and a.reassigned_from is None
    want = assigned_tasks(a.contract.task.name, a.contract.task.params, a.seed, cfg.tasks_per_node)
    assert len(want) == cfg.tasks_per_node
    assert [(t.task_id, t.prompt) for t in a.tasks] == [(t.task_id, t.prompt) for t in want]
    assert a.contract == cfg.contract
    # the next heartbeat (here signed, through the hot path) hands back the same assignment, not a new one
    hb_body = HeartbeatRequest().model_dump_json().encode()
    hb_path = "/v1/nodes/heartbeat"
    again = orch.assignments.signed_heartbeat(SignedRequest("POST", hb_path, sign_request(key, "POST", hb_path, hb_body),
                                                            body_sha256(hb_body)), HeartbeatRequest())
    assert [x.assignment_id for x in again.assignments] == [a.assignment_id]
    assert orch.telemetry.counters["heartbeats"] == 2


def test_an_orchestrator_without_rollouts_hands_out_no_work(tmp_path):
    # a DiLoCo swarm's orchestrator (rollouts = False): members register and heartbeat, nobody is given rollouts
    cfg, _ = make_cfg(tmp_path, database_url="", rollouts=False)
    orch = Orchestrator(cfg)
    try:
        p = join(orch)
        for _ in range(2):
            hb = orch.assignments.heartbeat(p, HeartbeatRequest())
            assert hb.node_id == p.node_id and hb.assignments == []
        with orch.db.tx() as s:
            assert s.query(Assignment).count() == 0
    finally:
        orch.db.dispose()


def test_silent_node_is_swept_and_its_work_reassigned(service):
    orch, cfg, _ = service
    t0 = time.time()
    quitter, other = join(orch, now=t0), join(orch, now=t0)
    lost = orch.assignments.heartbeat(quitter, HeartbeatRequest(), now=t0).assignments[0]
    own = orch.assignments.heartbeat(other, HeartbeatRequest(), now=t0).assignments[0]
    limit = cfg.heartbeat_interval_s * cfg.dead_after_missed
    assert orch.membership.sweep(now=t0 + limit - 1.0) == []  # not late enough yet
    orch.assignments.heartbeat(other, HeartbeatRequest(), now=t0 + limit - 1.0)
    assert orch.membership.sweep(now=t0 + limit + 1.0) == [quitter.node_id]
    assert orch.membership.node_info(quitter.node_id).status == "dead"
    assert orch.membership.node_info(other.node_id).status == "active"

    hb = orch.assignments.heartbeat(other, HeartbeatRequest(), now=t0 + limit + 2.0)
    taken = [x for x in hb.assignments if x.reassigned_from == quitter.node_id]
    assert len(taken) == 1, hb.assignments
    t = taken[0]
    assert t.assignment_id not in (lost.assignment_id, own.assignment_id)
    assert (t.seed, t.step, [x.task_id for x in t.tasks]) == (lost.seed, lost.step, [x.task_id for x in lost.tasks])
    assert own.assignment_id in [x.assignment_id for x in hb.assignments]
    # the quitter comes back: active again, but its old work now belongs to the other node
    back = orch.assignments.heartbeat(quitter, HeartbeatRequest(), now=t0 + limit + 3.0)
    assert orch.membership.node_info(quitter.node_id).status == "active"
    assert lost.assignment_id not in [x.assignment_id for x in back.assignments]


def test_replayed_nonce_is_refused(service):
    orch, _, _ = service
    key = generate_key()
    orch.membership.register(worker(key), RegisterRequest(throughput=10.0, stake=100.0))
    path = "/v1/nodes/heartbeat"
    body = b"{}"
    headers = sign_request(key, "POST", path, body)
    p = orch.auth.authenticate(SignedRequest("POST", path, headers, body_sha256(body)), ("worker",))
    assert p.node_id == node_id_for(public_key_hex(key))
    with pytest.raises(ProtocolError) as e:
        orch.auth.authenticate(SignedRequest("POST", path, headers, body_sha256(body)), ("worker",))
    assert e.value.status == 401 and e.value.detail == "replayed nonce"
    # a fresh nonce is fine; a body that does not match the signed hash, or an unknown key, is not
    assert orch.auth.authenticate(SignedRequest("POST", path, sign_request(key, "POST", path, body), body_sha256(body)),
                                  ("worker",)).node_id == p.node_id
    with pytest.raises(ProtocolError) as e:
        orch.auth.authenticate(SignedRequest("POST", path, sign_request(key, "POST", path, body), body_sha256(b"{ }")),
                               ("worker",))
    assert e.value.status == 401 and "content hash" in e.value.detail
    stranger = generate_key()
    with pytest.raises(ProtocolError) as e:
        orch.auth.authenticate(SignedRequest("POST", path, sign_request(stranger, "POST", path, body), body_sha256(body)),
                               ("worker",))
    assert e.value.status == 401 and "register first" in e.value.detail


def test_a_node_ejected_while_its_upload_streams_in_is_refused(service, tmp_path):
    """An upload is authenticated when its request starts and accepted when its body is in: a node ejected in
    between (a verdict on its earlier work) must not complete work, or it closes an honest holder's copy of the
    same family (seen in a swarm run: the honest node's upload was then refused with 409)."""
    from swarmrl.protocol.tables import Node

    orch, _, _ = service
    cheat = join(orch)
    a = orch.assignments.heartbeat(cheat, HeartbeatRequest()).assignments[0]
    path = write(rollouts_for(cheat.node_id, a), tmp_path / "r.parquet")
    data = path.read_bytes()
    orch.submissions.precheck_upload(cheat, a.assignment_id)  # admitted: not ejected yet
    with orch.db.tx() as s:  # ejected meanwhile (what a rejecting verdict on its other work does to the node)
        node = s.get(Node, cheat.node_id)
        node.status, node.status_reason = "ejected", "invalid submission 1: forged"
    with pytest.raises(ProtocolError) as e:
        orch.submissions.accept_upload(cheat, a.assignment_id, path, hashlib.sha256(data).hexdigest(), len(data))
    assert e.value.status == 403 and "ejected" in e.value.detail
    assert orch.submissions.pending(16).items == []


def test_rejecting_verdict_slashes_and_ejects(service, tmp_path):
    orch, cfg, keys = service
    cheat_key = generate_key()
    cheat = worker(cheat_key)
    orch.membership.register(cheat, RegisterRequest(throughput=10.0, stake=200.0))
    honest = join(orch)
    a = orch.assignments.heartbeat(cheat, HeartbeatRequest()).assignments[0]
    orch.assignments.heartbeat(honest, HeartbeatRequest())
    path = write(rollouts_for(cheat.node_id, a, correct=False, forge_rewards=True), tmp_path / "forged.parquet")
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    orch.submissions.precheck_upload(cheat, a.assignment_id)
    rep = orch.submissions.accept_upload(cheat, a.assignment_id, path, sha, len(data))
    assert rep.status == "pending" and rep.n_rows == len(a.tasks) * a.contract.group_size
    assert orch.store.path_for(sha).read_bytes() == data
    assert [x.submission.submission_id for x in orch.submissions.pending(16).items] == [rep.submission_id]

    vkey = keys["validator"]
    vpath = "/v1/validator/verdicts"
    req = VerdictRequest(submission_id=rep.submission_id, accepted=False, reason="forged rewards",
                         checks=[CheckResult(name="rewards", ok=False, reason="recomputed 0.0 != claimed 1.0")])
    body = req.model_dump_json().encode()
    vp = orch.auth.authenticate(SignedRequest("POST", vpath, sign_request(vkey, "POST", vpath, body), body_sha256(body)),
                                ("validator",))
    assert vp.role == "validator"
    reply = orch.verdicts.verdict(vp, req)
    assert reply.status == "rejected" and reply.ejected and reply.credited == 0.0
    assert reply.slashed == pytest.approx(200.0 * cfg.slash_fraction)

    with orch.db.tx() as s:
        assert ledger.balances(s, cheat.node_id).stake == pytest.approx(200.0 * (1 - cfg.slash_fraction))
    bal = orch.ledger.balance(cheat.node_id)
    assert bal.status == "ejected" and "slash" in [r.kind for r in bal.entries]
    assert orch.membership.node_info(cheat.node_id).status == "ejected"
    detail = orch.submissions.submission(rep.submission_id)
    assert detail.status == "rejected" and detail.validator_id == vp.node_id
    assert [(c.name, c.ok) for c in detail.checks] == [("rewards", False)]
    assert orch.submissions.pending(16).items == []
    # a second verdict on it is refused; the ejected key is locked out
    with pytest.raises(ProtocolError) as e:
        orch.verdicts.verdict(vp, req)
    assert e.value.status == 409
    hpath = "/v1/nodes/heartbeat"
    with pytest.raises(ProtocolError) as e:
        orch.auth.authenticate(SignedRequest("POST", hpath, sign_request(cheat_key, "POST", hpath, b"{}"),
                                             body_sha256(b"{}")), ("worker",))
    assert e.value.status == 403
    # its task goes back to the pool for an honest node
    hb = orch.assignments.heartbeat(honest, HeartbeatRequest())
    assert [x.seed for x in hb.assignments if x.reassigned_from == cheat.node_id] == [a.seed]


def test_service_imports_no_http_stack():
    code = ("import swarmrl.protocol.orchestrator.service, sys; assert 'fastapi' not in sys.modules; "
            "assert not {'starlette', 'uvicorn'} & set(sys.modules), sorted(sys.modules); "
            "import swarmrl.protocol.orchestrator as o; assert callable(o.create_app) and 'fastapi' in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def test_demand_mode_counts_open_work_at_the_usable_share_uploads_showed(tmp_path):
    """Open work is expected to yield the share of usable (not tied) groups recent uploads had, so a step whose
    uploads tie often hands out more work at once instead of waiting for each upload to come short."""
    import dataclasses

    cfg, _ = make_cfg(tmp_path, database_url="", groups_per_step=6, overassign=1.0, tasks_per_node=3, contract={"group_size": 2})
    orch = Orchestrator(cfg)
    try:
        first = join(orch)
        a = orch.assignments.heartbeat(first, HeartbeatRequest()).assignments[0]
        rows = rollouts_for(first.node_id, a)  # all correct: every group's rewards tie
        rows[1] = dataclasses.replace(rows[1], reward=0.0, task_reward=0.0)  # ...but group 0's
        path = write(rows, tmp_path / "one-usable.parquet")
        data = path.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        p = dataclasses.replace(first, content_sha256=sha)
        assert orch.submissions.accept_upload(p, a.assignment_id, path, sha, len(data)).status == "pending"
        # 1 usable group of 3: open work now counts 1 group per assignment, so 5 more nodes get work for step 0
        # (counting 3 per assignment, as before, only 2 would: 1 + 2 x 3 >= 6)
        got = [len(orch.assignments.heartbeat(join(orch), HeartbeatRequest()).assignments) for _ in range(7)]
        assert got == [1, 1, 1, 1, 1, 0, 0], got
    finally:
        orch.close()

