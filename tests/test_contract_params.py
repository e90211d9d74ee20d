"""``RLContract``: one typed object for every rule the roles share, carried under one name (``contract``) by the
run config, the orchestrator's and validator's configs and the wire schemas; and the one "which step needs work"
rule (``Demand``) the local worker and the orchestrator both follow."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

import pytest
from protocol_support import make_cfg
from pydantic import BaseModel, ValidationError

from swarmrl.config import load_config
from swarmrl.contract import AsyncWindow, Demand, RLContract
from swarmrl.job import RunConfig
from swarmrl.job.derive import Identity, derive_swarm, member_names
from swarmrl.protocol import schemas
from swarmrl.protocol.config import NodeConfig, OrchestratorConfig, ValidatorConfig
from swarmrl.protocol.orchestrator.errors import Principal
from swarmrl.protocol.orchestrator.service import Orchestrator
from swarmrl.protocol.schemas import HeartbeatRequest, PendingSubmission, RegisterRequest
from swarmrl.protocol.signing import node_id_for
from swarmrl.rl.config import RLConfig
from swarmrl.utils.keys import generate_key, public_key_hex

# nothing here is a default, so a field that is dropped or re-derived anywhere on the way shows
CONTRACT = {"task": {"name": "add", "params": {"digits": 3}}, "chat_template": True, "async_level": 3,
            "group_size": 5, "filter_ties": False,
            "budget": {"enabled": True, "tiers": [5, 9], "penalty": 0.125, "prompt_format": "<{target}>{prompt}",
                       "match_throughput": True, "step_time_s": 7.5},
            "proof": {"chunk": 16, "k": 64}}


def _identity(name: str) -> Identity:
    h = hashlib.sha256(name.encode()).hexdigest()
    return Identity(f"/keys/{name}.pem", h, h[:32])


def test_contract_round_trips_through_every_role_config_and_the_wire(tmp_path):
    want = RLContract.model_validate(CONTRACT)
    assert want != RLContract()
    cfg = load_config(RunConfig, "configs/run.toml", [f"rl.contract={_toml_inline(CONTRACT)}"])
    assert cfg.rl.contract == want
    members = {n: _identity(n) for n in member_names(cfg)}
    plan = derive_swarm(cfg, Path("/run/x"), 8765, "s3cret", _identity("validator"), _identity("trainer"), members,
                        _identity("authority"))
    # every role's config file, as the role reads it back
    rl = RLConfig.model_validate(tomllib.loads(plan.files["rl.toml"]))
    orch = OrchestratorConfig.model_validate(tomllib.loads(plan.files["orchestrator.toml"]))
    val = ValidatorConfig.model_validate(tomllib.loads(plan.files["validator.toml"]))
    assert rl.contract == orch.contract == val.contract == want

    # the wire: an assignment as a node reads it off a heartbeat reply, and as a validator reads it from the listing
    ocfg, _ = make_cfg(tmp_path, contract=CONTRACT, database_url="")
    assert ocfg.contract == want
    o = Orchestrator(ocfg)
    try:
        pub = public_key_hex(generate_key())
        p = Principal(node_id_for(pub), pub, "worker", "0" * 64)
        o.membership.register(p, RegisterRequest(throughput=1e6, stake=500.0))
        reply = o.assignments.heartbeat(p, HeartbeatRequest())
        wire = schemas.HeartbeatReply.model_validate_json(reply.model_dump_json())
        (a,) = wire.assignments
        assert a.contract == want and a.target_length in want.budget.tiers
        item = PendingSubmission(submission=_info(a), assignment=a, origin_node_id=p.node_id, current_step=0,
                                 current_policy_version=0)
        assert PendingSubmission.model_validate_json(item.model_dump_json()).assignment.contract == want
    finally:
        o.db.dispose()


def _info(a) -> schemas.SubmissionInfo:  # noqa: ANN001
    return schemas.SubmissionInfo(submission_id=1, node_id="n" * 32, assignment_id=a.assignment_id, step=a.step,
                                  sha256="0" * 64, size=1, n_rows=1, status="pending", created_at=0.0)


def _toml_inline(v: object) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_inline(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_toml_inline(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v + '"'
    return repr(v)


def _fields(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields)


def test_no_second_name_for_a_shared_rule():
    """The window, group size, tie rule, task, chat template and budget are only ever ``contract``'s fields."""
    shared = {"async_window", "async_level", "group_size", "filter_ties", "count_tied_groups", "chat_template",
              "budget_tiers", "budget_prompt_format", "budget_penalty", "target_step_time_s", "task", "budget", "env",
              "env_params"}
    for model in (RLConfig, OrchestratorConfig, ValidatorConfig, NodeConfig, schemas.AssignmentSpec,
                  schemas.HeartbeatReply, schemas.PendingSubmission):
        assert not _fields(model) & shared, (model.__name__, _fields(model) & shared)
    with pytest.raises(ValidationError, match="async_level -> contract.async_level"):
        RLConfig(async_level=2)


def test_contract_bounds_what_travels():
    for bad in ({"group_size": 1}, {"async_level": -1}, {"budget": {"tiers": [8, 4]}},
                {"budget": {"prompt_format": "{prompt.__class__}{target}"}}, {"proof": {"k": 0}},
                {"task": {"name": "x" * 201}}, {"task": {"name": "add", "params": {"p": "x" * 20000}}},
                {"budget": {"penalty": float("nan")}}):
        with pytest.raises(ValidationError):
            RLContract.model_validate(bad)


def test_validator_refuses_to_judge_under_other_rules(tmp_path):
    """A validator configured with the run's contract leaves an assignment under other rules pending (an
    internal error: the operator's mistake, never the node's); without one it takes each assignment's rules
    but checks proofs at its own geometry."""
    from swarmrl.protocol.validator import contract_mismatch

    ours = RLContract.model_validate(CONTRACT)
    a = schemas.AssignmentSpec(assignment_id=1, step=0, policy_version=0, seed=1, contract=ours, target_length=None,
                               tasks=[])
    item = PendingSubmission(submission=_info(a), assignment=a, origin_node_id="n", current_step=0,
                             current_policy_version=0)
    assert contract_mismatch(ValidatorConfig(contract=ours), item) is None
    other = ours.model_copy(update={"async_level": 0})
    why = contract_mismatch(ValidatorConfig(contract=other), item)
    assert why is not None and "async_level" in why
    # the task may differ (an assignment names its own), nothing else may
    assert contract_mismatch(ValidatorConfig(contract=ours.model_copy(update={"task": RLContract().task})), item) is None
    assert "proof" in contract_mismatch(ValidatorConfig(), item)  # geometry 16/64 is not the default 32/128
    a2 = a.model_copy(update={"contract": RLContract()})
    assert contract_mismatch(ValidatorConfig(), item.model_copy(update={"assignment": a2})) is None


def test_demand_picks_the_lowest_step_short_of_work():
    w = AsyncWindow(2, last_step=10)
    d = Demand(groups_per_step=4, overassign=1.5)  # need 6
    have = {3: 6.0, 4: 5.9, 5: 0.0}
    assert d.step_in_need(w, 5, 3, lambda s: have.get(s, 0.0)) == 4
    assert d.step_in_need(w, 1, 3, lambda s: have.get(s, 0.0)) is None  # version 1 serves step 3 only (has 6)
    assert d.step_in_need(w, 5, 3, lambda s: 9.0) is None
    assert d.step_in_need(w, 5, 3, lambda s: 0.0, lookahead=0) == 3
    assert d.step_in_need(AsyncWindow(2, last_step=3), 5, 3, lambda s: 6.0 if s == 3 else 0.0) is None  # past last
