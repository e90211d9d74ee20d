"""A node that cannot serve an assignment declines it (``POST /v1/assignments/{id}/decline``) instead of holding it
until ``assignment_timeout_s``: the work goes back up at once (same seed) for another node, is never handed back to
the decliner, and only the holder of an open assignment may decline it. ``SwarmNode.handle`` declines what its
policy source or its task environments cannot serve. Driven through the service with injected clocks, and over
HTTP with the signed client."""

from __future__ import annotations

import hashlib
import threading
import time
from types import SimpleNamespace

import pytest
from protocol_support import join_worker as _join
from protocol_support import make_cfg, rollouts_for, running, write
from sqlalchemy import select

from swarmrl.contract import RLContract
from swarmrl.envs.config import TaskConfig
from swarmrl.policy.sources import PolicyUnavailable
from swarmrl.protocol.client import ApiError, NodeClient
from swarmrl.protocol.orchestrator import Orchestrator, Principal, ProtocolError
from swarmrl.protocol.schemas import AssignmentSpec, HeartbeatReply, HeartbeatRequest
from swarmrl.protocol.signing import generate_key
from swarmrl.protocol.tables import Assignment, LedgerEntry
from swarmrl.swarm.node import SwarmNode

T0 = 1_000_000.0
HB = HeartbeatRequest()
# demand mode where one assignment holds a whole step: a second node gets work only when the first gives it up
DEMAND = dict(groups_per_step=2, tasks_per_node=2,
              contract={"group_size": 2, "async_level": 0, "filter_ties": False, "budget": {"enabled": False}})




def _seeds(orch: Orchestrator, p: Principal, now: float) -> list[int]:
    return [a.seed for a in orch.assignments.heartbeat(p, HB, now=now).assignments]


def _refusal(call, *args) -> ProtocolError:  # noqa: ANN001
    with pytest.raises(ProtocolError) as e:
        call(*args)
    return e.value


def _ledger_rows(orch: Orchestrator) -> int:
    with orch.db.tx() as s:
        return len(s.execute(select(LedgerEntry.id)).all())


def test_declined_work_goes_to_another_node_at_once(service):
    orch, _ = service(**DEMAND)
    a, b = _join(orch, T0), _join(orch, T0)
    [x] = orch.assignments.heartbeat(a, HB, now=T0).assignments
    assert _seeds(orch, b, T0) == []  # the step is fully held by A's assignment
    rows = _ledger_rows(orch)
    reply = orch.submissions.decline(a, x.assignment_id, "policy unavailable", now=T0 + 1)
    assert reply.assignment_id == x.assignment_id and reply.status == "orphaned"
    [y] = orch.assignments.heartbeat(b, HB, now=T0 + 2).assignments  # long before any assignment_timeout_s
    assert y.seed == x.seed and y.step == x.step and y.reassigned_from == a.node_id
    assert x.seed not in _seeds(orch, a, T0 + 3)  # the decliner holds no copy of it
    assert _ledger_rows(orch) == rows  # no penalty, no ledger change
    assert orch.membership.node_info(a.node_id).status == "active"
    prom = orch.telemetry.prom.registry.get_sample_value("swarmrl_orchestrator_assignments_declined_total")
    assert prom == 1.0


def test_the_decliner_never_gets_the_work_back(service):
    """Neither by reclaiming its own orphaned row when it comes back from the dead, nor by taking over the row of
    a taker that died; a third node takes it."""
    orch, cfg = service(**DEMAND)
    dead = cfg.heartbeat_interval_s * cfg.dead_after_missed
    a, b = _join(orch, T0), _join(orch, T0)
    [x] = orch.assignments.heartbeat(a, HB, now=T0).assignments
    orch.submissions.decline(a, x.assignment_id, "cannot build the task environment", now=T0)
    t = T0 + dead + 1
    assert set(orch.membership.sweep(now=t)) == {a.node_id, b.node_id}
    assert x.seed not in _seeds(orch, a, t + 1)  # back from the dead: its declined row is not re-opened
    with orch.db.tx() as s:
        assert s.get(Assignment, x.assignment_id).status == "orphaned"  # still up for others
    [y] = orch.assignments.heartbeat(b, HB, now=t + 2).assignments  # B is back too and takes it
    assert y.seed == x.seed
    orch.assignments.heartbeat(a, HB, now=t + 1 + dead / 2)
    t2 = t + 2 + dead + 1
    assert orch.membership.sweep(now=t2) == [b.node_id]  # B dies holding it: up again
    for i in range(3):
        assert x.seed not in _seeds(orch, a, t2 + 1 + i)  # not handed back to A (its own row re-opened)
    c = _join(orch, t2)
    assert x.seed in _seeds(orch, c, t2 + 5)


def test_only_the_holder_of_an_open_assignment_may_decline_it(service, tmp_path):
    orch, _ = service(assignment_timeout_s=5.0, **DEMAND)
    a, b = _join(orch, T0), _join(orch, T0)
    [x] = orch.assignments.heartbeat(a, HB, now=T0).assignments
    e = _refusal(orch.submissions.decline, b, x.assignment_id, "not mine")
    assert e.status == 403 and "holder" in e.detail, e.detail
    e = _refusal(orch.submissions.decline, a, 10**9, "unknown")
    assert e.status == 404, e.detail
    assert _seeds(orch, b, T0 + 1) == []  # B's refused attempt changed nothing
    orch.submissions.decline(a, x.assignment_id, "first")
    e = _refusal(orch.submissions.decline, a, x.assignment_id, "again")
    assert e.status == 409 and "declined already" in e.detail, e.detail
    [y] = orch.assignments.heartbeat(b, HB, now=T0 + 2).assignments
    path = write(rollouts_for(b.node_id, y), tmp_path / "b.parquet")
    data = path.read_bytes()
    orch.submissions.precheck_upload(b, y.assignment_id)
    orch.submissions.accept_upload(b, y.assignment_id, path, hashlib.sha256(data).hexdigest(), len(data))
    e = _refusal(orch.submissions.decline, b, y.assignment_id, "after uploading it")
    assert e.status == 409 and "uploaded" in e.detail, e.detail
    # a copy closed by another holder's upload: the original holder timed out, a taker uploaded first
    orch2, _ = service(assignment_timeout_s=5.0, **DEMAND)
    slow, taker = _join(orch2, T0), _join(orch2, T0)
    [xs] = orch2.assignments.heartbeat(slow, HB, now=T0).assignments
    orch2.assignments.heartbeat(slow, HB, now=T0 + 5.5)
    orch2.assignments.heartbeat(taker, HB, now=T0 + 5.5)
    orch2.membership.sweep(now=T0 + 6.0)
    [xt] = orch2.assignments.heartbeat(taker, HB, now=T0 + 6.5).assignments
    e = _refusal(orch2.submissions.decline, slow, xs.assignment_id, "taken over")
    assert e.status == 409 and "taken over" in e.detail, e.detail
    path = write(rollouts_for(taker.node_id, xt), tmp_path / "t.parquet")
    data = path.read_bytes()
    orch2.submissions.accept_upload(taker, xt.assignment_id, path, hashlib.sha256(data).hexdigest(), len(data))
    e = _refusal(orch2.submissions.decline, slow, xs.assignment_id, "closed")
    assert e.status == 409 and "closed" in e.detail and "completed" in e.detail, e.detail


def test_outside_demand_mode_declined_work_is_not_listed_again_and_goes_to_others(service):
    """One assignment per node and step: the decliner is not handed its step's work again (nor a new one for that
    step); like a dead node's work, it is taken over by another node (``reassign_per_heartbeat``)."""
    orch, _ = service()
    a, b = _join(orch, T0), _join(orch, T0)
    [x] = orch.assignments.heartbeat(a, HB, now=T0).assignments
    [own] = orch.assignments.heartbeat(b, HB, now=T0).assignments
    orch.submissions.decline(a, x.assignment_id, "policy unavailable", now=T0 + 1)
    for i in range(3):
        assert orch.assignments.heartbeat(a, HB, now=T0 + 2 + i).assignments == []
    got = orch.assignments.heartbeat(b, HB, now=T0 + 6).assignments
    assert sorted(g.seed for g in got) == sorted([own.seed, x.seed])


def test_declining_over_http_wakes_a_waiting_node(tmp_path):
    cfg, _ = make_cfg(tmp_path, **DEMAND)
    with running(cfg, run_sweeper=False) as srv:
        a, b = NodeClient(srv.url, generate_key()), NodeClient(srv.url, generate_key())
        for n in (a, b):
            n.register(throughput=10.0, stake=100.0)
        [x] = a.heartbeat().assignments
        assert b.heartbeat().assignments == []
        with pytest.raises(ApiError) as e:
            b.decline(x.assignment_id, "not mine")
        assert e.value.status == 403
        with pytest.raises(ApiError) as e:  # the reason is bounded
            a.request("POST", f"/v1/assignments/{x.assignment_id}/decline", {"reason": "x" * 501})
        assert e.value.status == 422
        got: list[HeartbeatReply] = []
        th = threading.Thread(target=lambda: got.append(b.heartbeat(wait=10.0)))
        th.start()
        deadline = time.monotonic() + 30
        while srv.orch.changes._waiters["work"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # B's poll is held, waiting for work
        rep = a.decline(x.assignment_id, "policy version unavailable")
        assert rep.status == "orphaned"
        th.join(timeout=60)
        assert [y.seed for y in got[0].assignments] == [x.seed]  # the held poll woke with the work (no 10 s wait)
        with pytest.raises(ApiError) as e:
            a.decline(x.assignment_id, "again")
        assert e.value.status == 409 and "declined already" in e.value.detail


# ---- the node -------------------------------------------------------------------------------------------------
class _Client:
    def __init__(self, refuse: ApiError | None = None) -> None:
        self.declined: list[tuple[int, str]] = []
        self.refuse = refuse

    def decline(self, assignment_id: int, reason: str = "") -> None:
        if self.refuse is not None:
            raise self.refuse
        self.declined.append((assignment_id, reason))


def _node(client: _Client, generate=None) -> SwarmNode:  # noqa: ANN001
    node = object.__new__(SwarmNode)  # the parts handle uses, without a model
    rows: list[dict] = []
    node.client, node.envs = client, {}
    node.stats = {"assignments": 0, "submitted": 0, "refused": 0, "skipped": 0}
    node.metrics = SimpleNamespace(write=lambda **row: rows.append(row), rows=rows)
    if generate is not None:
        node.generate = generate
    return node


def _spec(task: str = "add", params: dict | None = None) -> AssignmentSpec:
    return AssignmentSpec(assignment_id=7, step=3, policy_version=3, seed=1, target_length=None, tasks=[],
                          contract=RLContract(task=TaskConfig(name=task, params=params or {}), group_size=2))


def _reply() -> HeartbeatReply:
    return HeartbeatReply(node_id="n", step=3, policy_version=3, heartbeat_interval_s=10.0, weight_relays=[],
                          assignments=[])


def _unavailable(a: AssignmentSpec):  # noqa: ANN202
    raise PolicyUnavailable("version 3 was pruned")


@pytest.mark.parametrize("cause", ["policy", "env"])
def test_the_node_declines_what_it_cannot_serve(cause):
    client = _Client()
    node = _node(client, generate=_unavailable if cause == "policy" else None)
    node.handle(_spec() if cause == "policy" else _spec("no-such-task"), _reply())
    [(aid, reason)] = client.declined
    assert aid == 7 and ("pruned" in reason if cause == "policy" else "no-such-task" in reason), reason
    [row] = node.metrics.rows
    assert row["event"] == "skipped" and row["declined"] is True and node.stats["skipped"] == 1


def test_a_refused_decline_is_recorded_and_only_an_ejection_stops_the_node():
    node = _node(_Client(ApiError(409, "assignment 7 is reassigned, not open")), generate=_unavailable)
    node.handle(_spec(), _reply())  # logged, not raised
    [row] = node.metrics.rows
    assert row["declined"] is False and row["decline_status"] == 409
    node = _node(_Client(ApiError(403, "node is ejected: slashed")), generate=_unavailable)
    with pytest.raises(ApiError):
        node.handle(_spec(), _reply())
    assert node.metrics.rows[-1]["declined"] is False
