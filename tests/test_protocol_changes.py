"""Long polls: the validator waits for uploads, the trainer's adapter for verdicts, an idle node's heartbeat for
work to open (a new step)."""

from __future__ import annotations

import threading

import pytest
from protocol_support import make_cfg, rollouts_for, running, write

from swarmrl.protocol.client import ApiError, NodeClient, TrainerClient, ValidatorClient
from swarmrl.protocol.orchestrator.changes import Changes
from swarmrl.protocol.schemas import VerdictRequest
from swarmrl.protocol.signing import generate_key


def test_wait_answers_at_once_when_the_counter_moved_and_wakes_on_a_bump():
    c = Changes()
    assert c.wait("uploads", since=-1, timeout=10.0) == 0  # unknown -> the counter, at once
    assert c.wait("uploads", since=0, timeout=0.01) == 0  # nothing happened: the timeout
    c.bump("uploads")
    assert c.wait("uploads", since=0, timeout=10.0) == 1  # moved before the wait: at once
    assert c.generation("verdicts") == 0
    got = []
    t = threading.Thread(target=lambda: got.append(c.wait("verdicts", since=0, timeout=30.0)))
    t.start()
    c.bump("verdicts")
    t.join(timeout=60)
    assert got == [1]  # woken by the bump (a missed wake-up would have answered 0 after 30 s)


def test_too_many_waiters_answer_at_once():
    c = Changes(max_waiters={"uploads": 0})
    assert c.wait("uploads", since=0, timeout=30.0) == 0
    assert c.wait_waited("uploads", since=0, timeout=30.0) == (0, False)  # not held
    assert c.wait_waited("work", since=0, timeout=0.01) == (0, True)  # each kind has its own places


def test_an_idle_nodes_heartbeat_waits_for_the_next_step(tmp_path):
    cfg, keys = make_cfg(tmp_path, contract={"async_level": 0})
    with running(cfg, run_sweeper=False) as srv:
        node = NodeClient(srv.url, generate_key())
        node.register(throughput=10.0, stake=100.0)
        t = TrainerClient(srv.url, keys["trainer"])
        first = node.heartbeat()
        assert first.long_poll and len(first.assignments) == 1
        a = first.assignments[0]
        node.submit(a.assignment_id, write(rollouts_for(node.node_id, a), tmp_path / "r.parquet"))
        idle = node.heartbeat(wait=0.05)  # its work for step 0 is done, and no step is open beyond it
        assert idle.assignments == [] and idle.long_poll and idle.step == 0
        got = []
        th = threading.Thread(target=lambda: got.append(node.heartbeat(wait=10.0)))
        th.start()
        t.set_step(1, 1)
        th.join(timeout=60)
        assert [x.step for x in got[0].assignments] == [1] and got[0].step == 1  # woken by the new step
        srv.orch.changes.max_waiters["work"] = 0  # no waiting place: answered at once, and says so
        node.submit(got[0].assignments[0].assignment_id,
                    write(rollouts_for(node.node_id, got[0].assignments[0]), tmp_path / "r1.parquet"))
        full = node.heartbeat(wait=10.0)
        assert full.assignments == [] and not full.long_poll
        with pytest.raises(ApiError) as e:  # the wait is bounded
            node.heartbeat(wait=60.0)
        assert e.value.status == 422


def test_an_idle_node_long_polls_instead_of_sleeping_its_interval(tmp_path):
    """run_node: after a reply without work from an orchestrator that takes long polls, the next heartbeat carries
    ?wait=<interval> and no sleep; from one that does not (long_poll False), it sleeps the interval."""
    from swarmrl.protocol.node import run_node
    from swarmrl.protocol.schemas import HeartbeatReply

    def reply(long_poll: bool) -> HeartbeatReply:
        return HeartbeatReply(node_id="n", step=0, policy_version=0, heartbeat_interval_s=30.0,
                              weight_relays=[], assignments=[], long_poll=long_poll)

    class Fake:
        def __init__(self, long_poll: bool) -> None:
            self.waits: list[float] = []
            self.long_poll = long_poll

        def beat(self, wait: float = 0.0) -> HeartbeatReply:
            self.waits.append(wait)
            return reply(self.long_poll)

    stop = threading.Event()
    lp = Fake(True)
    assert run_node(lp, stop=stop, max_beats=3) == 3  # no 30 s sleeps between them
    assert lp.waits == [0.0, 10.0, 10.0]  # capped at what an orchestrator holds
    old = Fake(False)
    th = threading.Thread(target=lambda: run_node(old, stop=stop, max_beats=3))
    th.start()
    th.join(timeout=2.0)
    assert th.is_alive() and old.waits == [0.0]  # sleeping its 30 s interval
    stop.set()
    th.join(timeout=60)


def test_a_node_that_does_no_work_beats_on_its_interval_not_in_a_storm(tmp_path):
    """A node started without a way to serve its assignments (``swarmrl node run`` without ``--rl-config``) holds
    work it never answers. The orchestrator answers a held poll at once while the node holds work, so the node's
    loop asked again at once: 1,628 heartbeats in 30 s against a running swarm (issue 39). It sleeps its interval."""
    from swarmrl.protocol.node import run_node

    cfg, _ = make_cfg(tmp_path, heartbeat_interval_s=1.0)
    with running(cfg, run_sweeper=False) as srv:
        node = NodeClient(srv.url, generate_key())
        node.register(throughput=10.0, stake=100.0)
        replies = []
        stop = threading.Event()
        th = threading.Thread(target=lambda: run_node(node, handler=None, stop=stop, on_reply=replies.append))
        th.start()
        stop.wait(3.0)
        stop.set()
        th.join(timeout=30)
    assert replies and all(r.assignments for r in replies)  # it held work the whole time
    assert len(replies) <= 5, f"{len(replies)} heartbeats in 3 s at a 1 s interval"


@pytest.mark.parametrize("hot", [True, False])
def test_a_node_beating_faster_than_its_interval_is_throttled(tmp_path, hot):
    """At most ``heartbeats_per_interval`` heartbeats per interval from one key (on the hot path and the full one):
    beyond, 429 with when to come back; another node is not affected."""
    cfg, _ = make_cfg(tmp_path, heartbeat_interval_s=10.0, heartbeats_per_interval=3, fast_heartbeats=hot)
    with running(cfg, run_sweeper=False) as srv:
        fast, other = NodeClient(srv.url, generate_key()), NodeClient(srv.url, generate_key())
        for n in (fast, other):
            n.register(throughput=10.0, stake=100.0)
        for _ in range(3):
            fast.heartbeat()
        with pytest.raises(ApiError) as e:
            fast.heartbeat()
        assert e.value.status == 429 and "faster than 3 per 10 s" in str(e.value)
        assert e.value.retry_after and 1 <= e.value.retry_after <= 4  # a token every 3.3 s
        assert other.heartbeat().node_id == other.node_id


def test_pending_and_accepted_long_polls_answer_when_an_upload_or_a_verdict_comes(tmp_path):
    cfg, keys = make_cfg(tmp_path, contract={"async_level": 2})
    with running(cfg, run_sweeper=False) as srv:
        node = NodeClient(srv.url, generate_key())
        node.register(throughput=10.0, stake=100.0)
        v = ValidatorClient(srv.url, keys["validator"])
        t = TrainerClient(srv.url, keys["trainer"])
        first = t.accepted_window()
        assert first.items == [] and first.changes == 0 and first.step == 0
        assert v.pending(wait=0.05).items == []  # nothing came: the wait ran out
        a = node.heartbeat().assignments[0]
        path = write(rollouts_for(node.node_id, a), tmp_path / "r.parquet")
        listed = []
        th = threading.Thread(target=lambda: listed.append(v.pending(wait=10.0)))
        th.start()
        sub = node.submit(a.assignment_id, path)
        th.join(timeout=60)
        assert [it.submission.submission_id for it in listed[0].items] == [sub.submission_id]
        assert t.accepted_window(since=first.changes, wait=0.05).items == []  # no verdict yet
        got = []
        th = threading.Thread(target=lambda: got.append(t.accepted_window(since=first.changes, wait=10.0)))
        th.start()
        v.verdict(VerdictRequest(submission_id=sub.submission_id, accepted=True, reason="", checks=[]))
        th.join(timeout=60)
        assert [it.submission_id for it in got[0].items] == [sub.submission_id] and got[0].changes == 1
        with pytest.raises(ApiError) as e:  # a node may not hold a server thread in a long poll
            node.request("GET", "/v1/trainer/accepted", params={"since": 0, "wait": 1.0})
        assert e.value.status == 403
        with pytest.raises(ApiError) as e:  # the wait is bounded
            v.pending(wait=60.0)
        assert e.value.status == 422


def test_an_upload_is_answered_with_the_nodes_next_heartbeat_reply(tmp_path):
    cfg, _ = make_cfg(tmp_path)
    with running(cfg, run_sweeper=False) as srv:
        node = NodeClient(srv.url, generate_key())
        node.register(throughput=10.0, stake=100.0)
        a = node.heartbeat().assignments[0]
        rep = node.submit(a.assignment_id, write(rollouts_for(node.node_id, a), tmp_path / "r.parquet"))
        assert rep.next is not None and rep.next.node_id == node.node_id
        assert a.assignment_id not in [x.assignment_id for x in rep.next.assignments]  # that work is done
        assert node.beat() is rep.next  # used once, instead of a request
        again = node.beat()  # then a real heartbeat
        assert again is not rep.next and again.node_id == node.node_id


def test_close_wakes_every_held_wait_and_later_ones_answer_at_once():
    c = Changes()
    got = []
    th = threading.Thread(target=lambda: got.append(c.wait_waited("uploads", since=0, timeout=60.0)))
    th.start()
    while c._waiters["uploads"] == 0 and th.is_alive():
        threading.Event().wait(0.01)
    c.close()
    th.join(timeout=30)
    assert got == [(0, True)]  # held, then woken with the counter unchanged
    assert c.wait_waited("verdicts", since=0, timeout=60.0) == (0, False)  # not held at all once closed


def test_a_stopping_orchestrator_answers_its_long_polls_instead_of_waiting_them_out(tmp_path):
    """uvicorn's shutdown waits for the requests in flight; a held long poll (up to 10 s) would keep the server
    up that long. ``ClosingServer`` wakes them first (``Changes.close``), as ``serve`` runs it."""
    import uvicorn

    from swarmrl.protocol.orchestrator import Orchestrator, create_app
    from swarmrl.protocol.orchestrator.guard import ClosingServer

    cfg, keys = make_cfg(tmp_path)
    orch = Orchestrator(cfg)
    server = ClosingServer(uvicorn.Config(create_app(cfg, orch, run_sweeper=False), host="127.0.0.1", port=0,
                                          log_level="warning"), on_close=orch.changes.close)
    st = threading.Thread(target=server.run, daemon=True)
    st.start()
    while not server.started and st.is_alive():
        threading.Event().wait(0.02)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    v = ValidatorClient(url, keys["validator"])
    listed = []
    th = threading.Thread(target=lambda: listed.append(v.pending(wait=10.0)))  # the longest a poll may hold
    th.start()
    while orch.changes._waiters["uploads"] == 0 and th.is_alive():
        threading.Event().wait(0.01)
    server.should_exit = True
    st.join(timeout=5)  # half the poll's wait: only a woken poll lets the server end by then
    assert not st.is_alive() and orch.changes.closed
    th.join(timeout=30)
    assert listed and listed[0].items == []
    orch.db.dispose()
