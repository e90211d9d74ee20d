"""Demand-driven assignment (swarm RL): enough work per step, rounds in the seed, the async window,
timeouts and refused uploads release work (the first upload of reassigned work wins), dead nodes' work is
reassigned, restarts lose nothing."""

from __future__ import annotations

import time

import pytest
from protocol_support import make_cfg, model_free_checks, rollouts_for, running, tokenizer, write

from swarmrl.contract import task_seed
from swarmrl.protocol.client import ApiError, NodeClient, TrainerClient, ValidatorClient
from swarmrl.protocol.config import ValidatorConfig
from swarmrl.protocol.signing import generate_key
from swarmrl.protocol.validator import Validator


def _nodes(url, n):
    out = []
    for _ in range(n):
        c = NodeClient(url, generate_key())
        c.register(throughput=10.0, stake=100.0)
        out.append(c)
    return out


def _open(c, step=None):
    return [a for a in c.heartbeat().assignments if step is None or a.step == step]


def test_demand_fills_steps_in_window_with_rounds(tmp_path):
    # 4 usable groups per step, 2 tasks per assignment, lookahead 1 = async window 1, steps 0..2 only
    cfg, keys = make_cfg(tmp_path, groups_per_step=4, tasks_per_node=2, contract={"group_size": 2, "async_level": 1, "budget": {"enabled": False}}, lookahead=1,
                         last_step=2)
    with running(cfg, run_sweeper=False) as srv:
        a, b, c, d, e = _nodes(srv.url, 5)
        [xa], [xb], [xc], [xd] = _open(a), _open(b), _open(c), _open(d)
        # two assignments cover step 0; the next two go to step 1 (policy 0 is within its window); then nothing
        assert [x.step for x in (xa, xb, xc, xd)] == [0, 0, 1, 1]
        assert all(x.policy_version == 0 and x.round == 0 and x.target_length is None for x in (xa, xb, xc, xd))
        assert _open(e) == []
        assert _open(a) == [xa]  # one open assignment per node at a time
        # a's file has tied rewards (all wrong): it counts for nothing, so a gets another round of step 0
        a.submit(xa.assignment_id, write(rollouts_for(a.node_id, xa, correct=False), tmp_path / "a0.parquet"))
        [xa1] = _open(a)
        assert (xa1.step, xa1.round) == (0, 1) and xa1.seed == task_seed(a.node_id, 0, cfg.run_secret, 1)
        assert xa1.seed != xa.seed
        # the validator re-derives round seeds
        val = Validator(vcfg := ValidatorConfig(run_secret="test-secret", work_dir=str(tmp_path / "v")),
                        client=ValidatorClient(srv.url, keys["validator"]), checks=model_free_checks(vcfg),
                        tokenizer=tokenizer())
        rows = rollouts_for(a.node_id, xa1, correct=True)
        rows[0].reward = rows[0].task_reward = 0.0
        rows[0].completion_ids = tokenizer().encode("x", add_special_tokens=False) + [tokenizer().eos_token_id]
        rows[0].logprobs = [-0.1] * len(rows[0].completion_ids)
        a.submit(xa1.assignment_id, write(rows, tmp_path / "a1.parquet"))
        verdicts = val.run_once()
        assert [v.accepted for _, v in verdicts] == [True, True], [v.reason for _, v in verdicts]
        seed_checks = [c for _, v in verdicts for c in v.checks if c.name == "seed"]
        assert all(c.ok for c in seed_checks)
        acc = TrainerClient(srv.url, keys["trainer"]).accepted(0)
        assert [x.informative for x in acc.items] == [0, 1]  # tied groups do not count; one group has a spread
        # the trainer moves on: step 3 is past last_step, step 2 needs work, steps < 2 get none
        TrainerClient(srv.url, keys["trainer"]).set_step(2, 2)
        [xe] = _open(e)
        assert xe.step == 2 and xe.policy_version == 2
        assert all(x.step >= 2 for x in a.heartbeat().assignments)


def test_refused_upload_and_timeout_release_work(tmp_path):
    cfg, _ = make_cfg(tmp_path, groups_per_step=2, tasks_per_node=2, contract={"group_size": 2, "async_level": 0, "budget": {"enabled": False}},
                      assignment_timeout_s=0.5)
    with running(cfg, run_sweeper=False) as srv:
        bad, slow, honest = _nodes(srv.url, 3)
        [xb] = _open(bad)
        assert _open(honest) == []  # step 0 is fully held
        (tmp_path / "junk.parquet").write_bytes(b"not parquet")
        with pytest.raises(ApiError) as e:
            bad.submit(xb.assignment_id, tmp_path / "junk.parquet")
        assert e.value.status == 422
        [xh] = _open(honest)  # released: the same seeded tasks go to an honest node
        assert xh.seed == xb.seed and xh.reassigned_from == bad.node_id
        honest.submit(xh.assignment_id, write(rollouts_for(honest.node_id, xh, correct=False), tmp_path / "h.parquet"))
        [xs] = _open(slow)  # tied rewards: still short, next taker
        srv.orch.membership.sweep(now=time.time() + 1.0)  # slow never delivers: timed out
        [xh2] = _open(honest)
        assert xh2.seed == xs.seed and xh2.reassigned_from == slow.node_id
        # both hold the work now: the first upload (here the slow node's, late but valid) completes it, and the
        # other copy is closed (one 409, gone from the heartbeats)
        slow.submit(xs.assignment_id, write(rollouts_for(slow.node_id, xs), tmp_path / "s.parquet"))
        with pytest.raises(ApiError) as e:
            honest.submit(xh2.assignment_id, write(rollouts_for(honest.node_id, xh2), tmp_path / "h2.parquet"))
        assert e.value.status == 409 and "completed" in e.value.detail
        assert xh2.assignment_id not in [x.assignment_id for x in _open(honest)]


def test_dead_node_work_reassigned_and_restart_keeps_assignments(tmp_path):
    cfg, _ = make_cfg(tmp_path, groups_per_step=4, tasks_per_node=2, contract={"group_size": 2, "async_level": 0, "budget": {"enabled": False}},
                      heartbeat_interval_s=0.2, dead_after_missed=2)
    keys = [generate_key() for _ in range(3)]
    with running(cfg, run_sweeper=False) as srv:
        a, b, c = (NodeClient(srv.url, k) for k in keys)
        for n in (a, b, c):
            n.register(throughput=10.0, stake=100.0)
        [xa], [xb] = _open(a), _open(b)
        assert _open(c) == []
    with running(cfg, run_sweeper=False) as srv:  # restart: same open assignments, nothing new handed out
        a, b, c = (NodeClient(srv.url, k) for k in keys)
        assert _open(a) == [xa] and _open(c) == []
        time.sleep(0.5)
        assert _open(a) == [xa] and _open(c) == []  # a and c beat; b stays silent
        assert b.node_id in srv.orch.membership.sweep()  # b missed 2 intervals: dead, its work orphaned
        [xc] = _open(c)
        assert xc.seed == xb.seed and xc.reassigned_from == b.node_id and xc.step == xb.step


def test_a_restarted_orchestrator_does_not_blame_nodes_for_its_outage(tmp_path):
    """Work in progress survives an orchestrator restart: right after it, every node's last heartbeat is as old as
    the outage, and the sweep must not mark them dead or put their open work up for others; once the orchestrator
    has been up for the intervals, a node that stays silent is dead as before."""
    cfg, _ = make_cfg(tmp_path, groups_per_step=4, tasks_per_node=2, contract={"group_size": 2, "async_level": 0, "budget": {"enabled": False}},
                      heartbeat_interval_s=0.2, dead_after_missed=2, idle_after_missed=1)
    keys = [generate_key() for _ in range(2)]
    with running(cfg, run_sweeper=False) as srv:
        a, b = (NodeClient(srv.url, k) for k in keys)
        for n in (a, b):
            n.register(throughput=10.0, stake=100.0)
        [xa] = _open(a)
        assert len(_open(b)) == 1  # b holds work too when the orchestrator goes down
    time.sleep(0.6)  # the outage: longer than dead_after_missed intervals
    with running(cfg, run_sweeper=False) as srv:
        assert srv.orch.membership.sweep() == []  # nobody blamed for the outage
        a, b = (NodeClient(srv.url, k) for k in keys)
        assert _open(a) == [xa]  # its work is still its own (not orphaned, not handed to anyone)
        time.sleep(0.5)
        assert _open(a) == [xa]
        assert srv.orch.membership.sweep() == [b.node_id]  # b stayed silent while the orchestrator was up: dead
