"""Orphaned work handed to another node completes exactly once, whoever submits first: the original holder
coming back, the new holder, or a holder taking back work of its own origin; the other copy gets one clear 409
and nothing is left open, orphaned or counted twice. Driven through the service with injected clocks."""

from __future__ import annotations

import hashlib
import threading
import time

import pytest
from protocol_support import join_worker as _join
from protocol_support import rollouts_for, write
from sqlalchemy import select

from swarmrl.protocol.orchestrator import Orchestrator, Principal, ProtocolError
from swarmrl.protocol.schemas import HeartbeatRequest
from swarmrl.protocol.tables import Assignment, Submission

T0 = 1_000_000.0
HB = HeartbeatRequest()




def _submit(orch: Orchestrator, p: Principal, a, tmp_path):  # noqa: ANN001
    path = write(rollouts_for(p.node_id, a), tmp_path / f"{p.node_id[:8]}-{a.assignment_id}.parquet")
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    orch.submissions.precheck_upload(p, a.assignment_id)
    return orch.submissions.accept_upload(p, a.assignment_id, path, sha, len(data))


def _refused(orch: Orchestrator, p: Principal, a, tmp_path) -> ProtocolError:  # noqa: ANN001
    with pytest.raises(ProtocolError) as e:
        _submit(orch, p, a, tmp_path)
    return e.value


def _family(orch: Orchestrator, seed: int) -> tuple[list[str], list[str]]:
    """Statuses of every assignment row with this seed, and of the submissions made for them."""
    with orch.db.tx() as s:
        rows = s.execute(select(Assignment).where(Assignment.seed == seed)).scalars().all()
        subs = s.execute(select(Submission).where(Submission.assignment_id.in_([r.id for r in rows]))).scalars().all()
        return sorted(r.status for r in rows), sorted(x.status for x in subs)


def _listed(orch: Orchestrator, p: Principal, seed: int, now: float) -> list:
    return [x for x in orch.assignments.heartbeat(p, HB, now=now).assignments if x.seed == seed]


@pytest.mark.parametrize("first", ["origin", "taker"])
def test_origin_takes_back_its_work_from_a_dead_taker(service, tmp_path, first):
    """A dies holding its work, B takes it over and dies too, A is back: A's heartbeats must keep working (the
    old code tried to insert a second (A, origin A, step, round) row and answered 409 on every heartbeat), A gets
    its work back, and when B also returns with its copy, the first upload wins and the other is closed."""
    orch, cfg = service()  # one assignment per node per step (no demand mode)
    dead = cfg.heartbeat_interval_s * cfg.dead_after_missed
    a, b = _join(orch, T0), _join(orch, T0)
    [x] = orch.assignments.heartbeat(a, HB, now=T0).assignments
    orch.assignments.heartbeat(b, HB, now=T0)
    orch.assignments.heartbeat(b, HB, now=T0 + dead / 2)
    t = T0 + dead + 1
    assert orch.membership.sweep(now=t) == [a.node_id]
    [y] = _listed(orch, b, x.seed, t + 1)  # B takes A's work over (same seed)
    assert y.reassigned_from == a.node_id and y.assignment_id != x.assignment_id
    assert _listed(orch, a, x.seed, t + 2) == []  # A is back: its work now belongs to B
    orch.assignments.heartbeat(a, HB, now=t + 1 + dead / 2)
    t2 = t + 1 + dead + 1
    assert orch.membership.sweep(now=t2) == [b.node_id]  # B dies holding A's work (and its own)
    for i in range(4):  # A takes B's own work and its own back, one per heartbeat, and is never locked out
        hb = orch.assignments.heartbeat(a, HB, now=t2 + 1 + i)
    back = [s for s in hb.assignments if s.seed == x.seed]
    assert len(back) == 1 and back[0].step == x.step, hb.assignments
    assert _family(orch, x.seed)[0].count("open") == 1
    # B comes back with its copy, still working on it: whoever uploads first completes the work
    orch.assignments.heartbeat(b, HB, now=t2 + 10)
    win, lose = ((a, back[0]), (b, y)) if first == "origin" else ((b, y), (a, back[0]))
    assert _submit(orch, *win, tmp_path).status == "pending"
    e = _refused(orch, *lose, tmp_path)
    assert e.status == 409 and "completed" in e.detail, e.detail
    assert _listed(orch, lose[0], x.seed, t2 + 11) == [] and _listed(orch, win[0], x.seed, t2 + 11) == []
    statuses, subs = _family(orch, x.seed)
    assert subs == ["pending"]  # done once
    assert "open" not in statuses and "orphaned" not in statuses, statuses  # nothing stuck
    assert [i.assignment.seed for i in orch.submissions.pending(16).items].count(x.seed) == 1


@pytest.mark.parametrize("first", ["original", "taker"])
@pytest.mark.parametrize("cause", ["timeout", "death"])
def test_first_upload_wins_between_original_holder_and_taker(service, tmp_path, first, cause):
    """Demand mode: the original holder's work goes to a taker (it timed out, or the holder was declared dead
    and came back); both work on it. The first upload completes it and counts once toward the step; the other
    holder gets one 409 saying so, the assignment leaves its heartbeats and the step is not handed out again."""
    orch, cfg = service(groups_per_step=2, tasks_per_node=2, contract={"group_size": 2, "async_level": 0, "filter_ties": False, "budget": {"enabled": False}},
                        assignment_timeout_s=5.0)
    slow, taker = _join(orch, T0), _join(orch, T0)
    [xs] = orch.assignments.heartbeat(slow, HB, now=T0).assignments
    assert orch.assignments.heartbeat(taker, HB, now=T0).assignments == []  # the step is fully held
    if cause == "timeout":
        orch.assignments.heartbeat(slow, HB, now=T0 + 5.5)
        orch.assignments.heartbeat(taker, HB, now=T0 + 5.5)
        assert orch.membership.sweep(now=T0 + 6.0) == []
        t = T0 + 6.5
    else:
        t = T0 + cfg.heartbeat_interval_s * cfg.dead_after_missed + 1
        orch.assignments.heartbeat(taker, HB, now=t - 2)
        assert orch.membership.sweep(now=t) == [slow.node_id]
    [xt] = _listed(orch, taker, xs.seed, t)
    assert xt.reassigned_from == slow.node_id
    orch.assignments.heartbeat(slow, HB, now=t + 0.5)  # the original holder is still (or again) there, working on its copy
    win, lose = ((slow, xs), (taker, xt)) if first == "original" else ((taker, xt), (slow, xs))
    assert _submit(orch, *win, tmp_path).status == "pending"
    e = _refused(orch, *lose, tmp_path)
    assert e.status == 409 and "completed" in e.detail, e.detail
    # the step has what it needs: nobody is handed more of it, the loser's copy is gone from its heartbeats
    assert orch.assignments.heartbeat(lose[0], HB, now=t + 1).assignments == []
    assert orch.assignments.heartbeat(win[0], HB, now=t + 1).assignments == []
    statuses, subs = _family(orch, xs.seed)
    assert subs == ["pending"] and "open" not in statuses and "orphaned" not in statuses, statuses


def test_both_holders_uploading_at_once_complete_the_work_once(service, tmp_path):
    """The original holder and the taker upload the same work at the same moment (two threads, each paused inside
    its upload's transaction after the holder check, so both are in it together unless one waits for the other).
    One upload completes it, the other gets the 409: on PostgreSQL because the upload locks its family's rows,
    on SQLite because transactions are serialised. Run on PostgreSQL with SWARMRL_TEST_DATABASE_URL (CI does)."""
    orch, _ = service(groups_per_step=2, tasks_per_node=2, contract={"group_size": 2, "async_level": 0, "filter_ties": False, "budget": {"enabled": False}},
                      assignment_timeout_s=5.0)
    slow, taker = _join(orch, T0), _join(orch, T0)
    [xs] = orch.assignments.heartbeat(slow, HB, now=T0).assignments
    orch.assignments.heartbeat(slow, HB, now=T0 + 5.5)
    orch.assignments.heartbeat(taker, HB, now=T0 + 5.5)
    orch.membership.sweep(now=T0 + 6.0)
    [xt] = _listed(orch, taker, xs.seed, T0 + 6.5)
    check = orch.submissions._check_duplicate

    def paused(s, p, sha):  # noqa: ANN001, ANN202
        time.sleep(0.5)  # inside the transaction: the other upload reaches its holder check meanwhile
        return check(s, p, sha)

    orch.submissions._check_duplicate = paused
    start = threading.Barrier(2)
    out: dict[str, object] = {}

    def upload(p: Principal, a) -> None:  # noqa: ANN001
        start.wait(10)
        try:
            out[p.node_id] = _submit(orch, p, a, tmp_path).status
        except Exception as e:  # noqa: BLE001  # a 409, or (without the lock) whatever the database said
            out[p.node_id] = e

    threads = [threading.Thread(target=upload, args=h) for h in ((slow, xs), (taker, xt))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    got = list(out.values())
    assert len(got) == 2 and got.count("pending") == 1, out
    [e] = [v for v in got if v != "pending"]
    assert isinstance(e, ProtocolError) and e.status == 409 and "completed" in e.detail, e
    statuses, subs = _family(orch, xs.seed)
    assert subs == ["pending"] and "open" not in statuses, (statuses, subs)


def test_released_work_is_not_hidden_by_the_node_that_released_it(service, tmp_path):
    """A refused upload puts the work back up; the releasing node's own heartbeat (it may not take its own work)
    must not hide it from everyone else (the old code cleared the orphan hint there, and with the step counted
    as held the honest node got nothing until the next sweep)."""
    orch, _ = service(groups_per_step=2, tasks_per_node=2, contract={"group_size": 2, "async_level": 0, "filter_ties": False, "budget": {"enabled": False}},
                      )
    bad, honest = _join(orch, T0), _join(orch, T0)
    [xb] = orch.assignments.heartbeat(bad, HB, now=T0).assignments
    assert orch.assignments.heartbeat(honest, HB, now=T0).assignments == []
    orch.submissions.release_assignment(bad, xb.assignment_id, "invalid rollout file")
    assert orch.assignments.heartbeat(bad, HB, now=T0 + 1).assignments == []
    [xh] = orch.assignments.heartbeat(honest, HB, now=T0 + 2).assignments
    assert xh.seed == xb.seed and xh.reassigned_from == bad.node_id
    assert _submit(orch, honest, xh, tmp_path).status == "pending"
    assert _family(orch, xb.seed)[1] == ["pending"]
