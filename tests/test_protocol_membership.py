"""Joining, stake, heartbeats, seeded assignments, thinking budgets, dead-node reassignment."""

from __future__ import annotations

import json
import time

import pytest
from protocol_support import make_cfg, running

from swarmrl.contract import task_seed, thinking_budget
from swarmrl.envs import make_env
from swarmrl.protocol.client import ApiError, NodeClient, TrainerClient
from swarmrl.protocol.signing import generate_key


def test_seed_and_budget_are_pure():
    assert task_seed("a" * 32, 3, "s") == task_seed("a" * 32, 3, "s")
    assert task_seed("a" * 32, 3, "s") != task_seed("a" * 32, 4, "s")
    assert task_seed("a" * 32, 3, "s") != task_seed("b" * 32, 3, "s")
    assert task_seed("a" * 32, 3, "s") != task_seed("a" * 32, 3, "t")
    assert 0 <= task_seed("a" * 32, 3, "s") < 2**63
    tiers = [64, 128, 256]
    assert thinking_budget(1.0, tiers, 8, 4, 60) == 64  # slow: smallest
    assert thinking_budget(64 * 32 / 60 + 0.1, tiers, 8, 4, 60) == 64
    assert thinking_budget(128 * 32 / 60 + 0.1, tiers, 8, 4, 60) == 128
    assert thinking_budget(1e6, tiers, 8, 4, 60) == 256
    assert thinking_budget(1e6, [], 8, 4, 60) is None


def test_register_stake_heartbeat_assignment(tmp_path):
    cfg, keys = make_cfg(tmp_path, min_stake=100.0, shardcast_relays=["http://127.0.0.1:9/r1"])
    with running(cfg, run_sweeper=False) as srv:
        slow, fast = NodeClient(srv.url, generate_key()), NodeClient(srv.url, generate_key())
        with pytest.raises(ApiError) as e:
            slow.register(throughput=1.0, stake=10.0)
        assert e.value.status == 422 and "below the minimum" in e.value.detail
        reg = slow.register(throughput=1.0, stake=120.0, hardware={"gpu": "none"})
        assert reg.node_id == slow.node_id and reg.stake_locked == 120.0
        with pytest.raises(ApiError) as e:
            slow.register(throughput=1.0, stake=120.0)
        assert e.value.status == 409
        fast.register(throughput=1e6, stake=100.0)
        assert slow.ledger().stake == 120.0

        hb = slow.heartbeat()
        assert hb.step == 0 and hb.weight_relays == ["http://127.0.0.1:9/r1"] and len(hb.assignments) == 1
        a = hb.assignments[0]
        assert a.seed == task_seed(slow.node_id, 0, cfg.run_secret)
        want = make_env(cfg.contract.task.name).sample(a.seed, cfg.tasks_per_node)
        assert [t.task_id for t in a.tasks] == [t.task_id for t in want]
        assert a.contract == cfg.contract
        # a second heartbeat returns the same assignment, not a new one
        assert [x.assignment_id for x in slow.heartbeat().assignments] == [a.assignment_id]
        fa = fast.heartbeat().assignments[0]
        assert fa.seed != a.seed  # tasks differ per node
        assert a.target_length == cfg.contract.budget.tiers[0] and fa.target_length == cfg.contract.budget.tiers[-1]

        # the trainer advances the step; new assignments follow, old ones stay inside the async window
        tc = TrainerClient(srv.url, keys["trainer"])
        tc.set_step(1, 1)
        with pytest.raises(ApiError) as e:
            tc.set_step(0, 0)
        assert e.value.status == 409
        hb = slow.heartbeat()
        assert hb.step == 1 and hb.policy_version == 1
        assert sorted(x.step for x in hb.assignments) == [0, 1]
        new = [x for x in hb.assignments if x.step == 1][0]
        assert new.seed == task_seed(slow.node_id, 1, cfg.run_secret) and new.policy_version == 1


def test_dead_node_work_is_reassigned(tmp_path):
    cfg, keys = make_cfg(tmp_path, heartbeat_interval_s=0.2, dead_after_missed=3, sweep_interval_s=0.05)
    with running(cfg, run_sweeper=True) as srv:
        quitter, worker = NodeClient(srv.url, generate_key()), NodeClient(srv.url, generate_key())
        quitter.register(throughput=10.0, stake=100.0)
        worker.register(throughput=10.0, stake=100.0)
        lost = quitter.heartbeat().assignments[0]
        # worker keeps beating; quitter goes silent and must be declared dead
        deadline = time.monotonic() + 20
        taken = None
        while time.monotonic() < deadline:
            hb = worker.heartbeat()
            taken = next((x for x in hb.assignments if x.reassigned_from == quitter.node_id), None)
            if taken is not None:
                break
            time.sleep(0.1)
        assert taken is not None, "dead node's assignment was never reassigned"
        assert worker.ledger().status == "active"
        info = srv.orch.membership.node_info(quitter.node_id)
        assert info.status == "dead" and "missed 3" in info.status_reason
        # same seed and tasks as the lost assignment: re-derivable by validators from the origin node
        assert taken.seed == lost.seed and [t.task_id for t in taken.tasks] == [t.task_id for t in lost.tasks]
        # the quitter comes back: alive again, but its taken-over assignment is gone
        hb = quitter.heartbeat()
        assert srv.orch.membership.node_info(quitter.node_id).status == "active"
        assert lost.assignment_id not in [x.assignment_id for x in hb.assignments]


def test_trainer_announces_weight_servers(tmp_path):
    """The trainer names its SHARDCAST servers and manifest key; heartbeats carry them; only a trainer may set
    them, URLs and keys are validated, and they survive an orchestrator restart."""
    cfg, keys = make_cfg(tmp_path)
    pub = "ab" * 32
    with running(cfg, run_sweeper=False) as srv:
        node = NodeClient(srv.url, generate_key())
        node.register(throughput=10.0, stake=100.0)
        hb = node.heartbeat()
        assert hb.weight_relays == [] and hb.weight_pubkey == ""
        tc = TrainerClient(srv.url, keys["trainer"])
        rep = tc.set_weights(["http://127.0.0.1:9001", "http://127.0.0.1:9002"], pub)
        assert rep.servers == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"] and rep.public_key == pub
        hb = node.heartbeat()
        assert hb.weight_relays == rep.servers and hb.weight_pubkey == pub
        for bad in (["file:///etc/passwd"], ["http://x/" + "a" * 400], ["http://h:1/"] * 65):
            with pytest.raises(ApiError) as e:
                tc.request("POST", "/v1/trainer/weights", {"servers": bad, "public_key": pub})
            assert e.value.status == 422
        with pytest.raises(ApiError) as e:
            tc.request("POST", "/v1/trainer/weights", {"servers": [], "public_key": "zz"})
        assert e.value.status == 422
        with pytest.raises(ApiError) as e:  # a node is not the trainer
            node.request("POST", "/v1/trainer/weights", {"servers": ["http://evil:1"], "public_key": pub})
        assert e.value.status == 403
    with running(cfg, run_sweeper=False) as srv:  # restart: the announcement is persisted
        hb = NodeClient(srv.url, node.key).heartbeat()
        assert hb.weight_relays == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"] and hb.weight_pubkey == pub


def test_assignment_budget_format_is_checked_where_a_node_reads_it():
    """A node formats its prompts with the assignment's budget format: a reply carrying anything but {prompt}
    and {target} (e.g. attribute access into the format arguments) fails to parse instead of being used."""
    from pydantic import ValidationError

    from swarmrl.protocol.schemas import AssignmentSpec

    def reply(budget: dict) -> str:  # the assignment as a node reads it off the wire
        return json.dumps({"assignment_id": 1, "step": 0, "policy_version": 0, "seed": 1, "target_length": 8,
                           "tasks": [], "contract": {"task": {"name": "add"}, "group_size": 2, "budget": budget}})

    assert AssignmentSpec.model_validate_json(reply({"prompt_format": "[{target}]{prompt}"})).budget() is not None
    for bad in ("{prompt.__class__.__init__.__globals__}{target}", "{target}", "{prompt}{target}{x}"):
        with pytest.raises(ValidationError):
            AssignmentSpec.model_validate_json(reply({"prompt_format": bad}))
    with pytest.raises(ValidationError):
        AssignmentSpec.model_validate_json(reply({"penalty": -1.0}))
