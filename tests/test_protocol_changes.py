"""Long polls of GET /v1/changes: the validator waits for uploads and the trainer's adapter for verdicts."""

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
    c = Changes(max_waiters=0)
    assert c.wait("uploads", since=0, timeout=30.0) == 0


def test_pending_and_accepted_long_polls_answer_when_an_upload_or_a_verdict_comes(tmp_path):
    cfg, keys = make_cfg(tmp_path, async_window=2)
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
