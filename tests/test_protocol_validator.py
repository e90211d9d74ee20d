"""Validator verdicts over a real orchestrator: honest work credited; forged rewards, self-chosen tasks
and too-old policies rejected, slashed, credits revoked, node ejected; pluggable and lazy checks."""

from __future__ import annotations

import time

import pytest
from protocol_support import fake_model, make_cfg, model_free_checks, rollouts_for, running, tokenizer, write

from swarmrl.protocol.client import ApiError, NodeClient, TrainerClient, ValidatorClient
from swarmrl.protocol.config import ValidatorConfig
from swarmrl.protocol.schemas import VerdictRequest
from swarmrl.protocol.signing import generate_key
from swarmrl.protocol.validator import Validator, lazy_check


def _validator(srv, keys, tmp, **kw) -> Validator:
    """No model: the checks that need none (a Validator with the model checks and no model refuses to start)."""
    vcfg = ValidatorConfig(run_secret="test-secret", work_dir=str(tmp / "val"), **kw)
    return Validator(vcfg, client=ValidatorClient(srv.url, keys["validator"]), checks=model_free_checks(vcfg),
                     tokenizer=tokenizer())


def _node(srv) -> NodeClient:
    n = NodeClient(srv.url, generate_key())
    n.register(throughput=10.0, stake=200.0)
    return n


@pytest.fixture()
def env(tmp_path):
    cfg, keys = make_cfg(tmp_path, slash_fraction=0.25, contract={"async_level": 1})
    with running(cfg, run_sweeper=False) as srv:
        yield srv, keys, tmp_path, cfg


def test_honest_accepted_then_forgery_slashes_and_revokes(env):
    srv, keys, tmp, cfg = env
    val = _validator(srv, keys, tmp)
    node = _node(srv)
    a0 = node.heartbeat().assignments[0]
    node.submit(a0.assignment_id, write(rollouts_for(node.node_id, a0, correct=False), tmp / "s0.parquet"))
    [(sid0, v0)] = val.run_once()
    assert v0.accepted, v0.reason
    assert not {c.name for c in v0.checks} & {"logprobs", "toploc", "sampling"}  # no model here: not run at all
    bal = node.ledger()
    assert bal.credits_locked == cfg.credit_per_sample * len(a0.tasks) * a0.contract.group_size and bal.stake == 200.0
    tc = TrainerClient(srv.url, keys["trainer"])
    assert [x.submission_id for x in tc.accepted(0).items] == [sid0]

    tc.set_step(1, 1)
    a1 = [x for x in node.heartbeat().assignments if x.step == 1][0]
    forged = rollouts_for(node.node_id, a1, correct=False, forge_rewards=True)  # wrong answers claimed correct
    node.submit(a1.assignment_id, write(forged, tmp / "s1.parquet"))
    [(sid1, v1)] = val.run_once()
    assert not v1.accepted and v1.reason.startswith("rewards:") and "verifier gives 0" in v1.reason
    detail = node.submission(sid1)  # the verdict and every check's reason are public and persisted
    assert detail.status == "rejected" and detail.reason == v1.reason
    # cheapest first (the model checks are not run here: no model), the reward re-check comes last
    assert [c.name for c in detail.checks] == ["schema", "seed", "tasks", "policy", "proofs", "replay", "rewards"]
    assert node.submission(sid0).status == "accepted"
    from swarmrl.utils.metrics import read_metrics

    events = [r for r in read_metrics(tmp / "orch" / "metrics.jsonl") if r["event"] == "verdict"]
    assert [(e["submission_id"], e["status"]) for e in events] == [(sid0, "accepted"), (sid1, "rejected")]
    assert events[1]["slashed"] == pytest.approx(50.0) and events[1]["revoked"] == events[0]["credited"]
    vrows = read_metrics(tmp / "val" / "metrics.jsonl")
    assert [r["accepted"] for r in vrows] == [True, False]
    snap = srv.orch.stats.snapshot()
    assert snap["nodes_ejected"] == 1 and snap["submissions_rejected"] == 1 and snap["submissions_accepted"] == 1
    bal = node.ledger()
    assert bal.status == "ejected"
    assert bal.stake == pytest.approx(200.0 * (1 - 0.25))
    assert bal.credits_locked == 0.0  # the earlier, honest credit was still in its window: revoked
    kinds = [e.kind for e in bal.entries]
    assert kinds == ["stake", "credit", "slash", "revoke"]
    assert bal.entries[3].ref_id == bal.entries[1].id
    with pytest.raises(ApiError) as e:
        node.heartbeat()
    assert e.value.status == 403
    assert tc.accepted(1).items == []
    # the rejected assignment's tasks go back to the pool for an honest node
    honest = _node(srv)
    hb = honest.heartbeat()
    redo = [x for x in hb.assignments if x.reassigned_from == node.node_id]
    assert len(redo) == 1 and redo[0].seed == a1.seed and redo[0].tasks == a1.tasks
    # reassigned work is validated against the original node's seed and accepted
    honest.submit(redo[0].assignment_id, write(rollouts_for(honest.node_id, redo[0]), tmp / "redo.parquet"))
    [(_, v2)] = val.run_once()
    assert v2.accepted, v2.reason
    assert [x.node_id for x in tc.accepted(1).items] == [honest.node_id]


def test_wrong_tasks_rejected(env):
    srv, keys, tmp, cfg = env
    val = _validator(srv, keys, tmp)
    node = _node(srv)
    a = node.heartbeat().assignments[0]
    easy = [(f"mul_add:0*0+{i}", f"0*0+{i}=", i) for i in range(len(a.tasks))]  # node picks easy tasks
    node.submit(a.assignment_id, write(rollouts_for(node.node_id, a, tasks=easy), tmp / "easy.parquet"))
    [(_, v)] = val.run_once()
    assert not v.accepted and v.reason.startswith("tasks:") and "seeded assignment" in v.reason
    assert node.ledger().status == "ejected"


def test_too_old_policy_rejected(env):
    srv, keys, tmp, cfg = env
    val = _validator(srv, keys, tmp)
    tc = TrainerClient(srv.url, keys["trainer"])
    tc.set_step(5, 5)
    node = _node(srv)
    a = node.heartbeat().assignments[0]
    stale = rollouts_for(node.node_id, a, policy_version=2)  # window is [4, 5]
    node.submit(a.assignment_id, write(stale, tmp / "old.parquet"))
    [(_, v)] = val.run_once()
    assert not v.accepted and v.reason.startswith("policy:") and "outside the async window" in v.reason
    # honest work that fell out of the window while the validator lagged is NOT slashed by default
    # (the validator's delay is not the node's fault; the trainer simply never uses it) ...
    node2 = _node(srv)
    a2 = node2.heartbeat().assignments[0]
    node2.submit(a2.assignment_id, write(rollouts_for(node2.node_id, a2), tmp / "late.parquet"))
    tc.set_step(8, 8)
    [(_, v2)] = val.run_once()
    assert v2.accepted, v2.reason
    assert node2.ledger().status != "ejected"
    # ... and is refused when the operator asks for it
    strict = _validator(srv, keys, tmp, reject_late_steps=True)
    node3 = _node(srv)
    a3 = node3.heartbeat().assignments[0]
    node3.submit(a3.assignment_id, write(rollouts_for(node3.node_id, a3), tmp / "late3.parquet"))
    tc.set_step(12, 12)
    [(_, v3)] = strict.run_once()
    assert not v3.accepted and "older than the async window" in v3.reason


def test_challenge_window_and_double_verdict(tmp_path):
    cfg, keys = make_cfg(tmp_path, challenge_window_s=0.5)
    with running(cfg, run_sweeper=False) as srv:
        val = _validator(srv, keys, tmp_path)
        node = _node(srv)
        a = node.heartbeat().assignments[0]
        node.submit(a.assignment_id, write(rollouts_for(node.node_id, a), tmp_path / "a.parquet"))
        [(sid, v)] = val.run_once()
        assert v.accepted
        vc = ValidatorClient(srv.url, keys["validator"])
        with pytest.raises(ApiError) as e:
            vc.verdict(VerdictRequest(submission_id=sid, accepted=True))
        assert e.value.status == 409
        deadline = time.monotonic() + 10
        while node.ledger().credits_locked > 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        bal = node.ledger()
        assert bal.credits_unlocked > 0 and bal.credits_locked == 0
        with pytest.raises(ApiError) as e:  # window closed: the credit can no longer be challenged
            vc.verdict(VerdictRequest(submission_id=sid, accepted=False, reason="late challenge"))
        assert e.value.status == 409 and "window is closed" in e.value.detail
        assert node.ledger().status == "active"


def test_pluggable_and_lazy_checks(env, tmp_path):
    srv, keys, tmp, cfg = env
    import sys
    import types

    seen = []
    fail_from = {"row": 10**9}

    calls = []

    def fake_verify(model, items, batch_size=1):  # batched: one call per policy version in a file
        calls.append((model, len(items), batch_size))
        out = []
        for prompt_ids, completion_ids, proofs, claim in items:
            seen.append((model, claim))
            ok = len(seen) <= fail_from["row"]
            out.append(types.SimpleNamespace(passed=ok, reason=None if ok else "proof mismatch at chunk 0",
                                             sampling=types.SimpleNamespace(passed=True, reasons=[])))
        return out

    mod = types.ModuleType("fake_toploc_mod")
    mod.verify = fake_verify
    mod.claim = lambda row, eos: ("claim", row.temperature, eos)
    sys.modules["fake_toploc_mod"] = mod
    try:
        vcfg = ValidatorConfig(run_secret="test-secret", work_dir=str(tmp / "v2"), toploc_check="fake_toploc_mod:verify",
                               sampling_claim="fake_toploc_mod:claim")
        val = Validator(vcfg, client=ValidatorClient(srv.url, keys["validator"]), tokenizer=tokenizer(),
                        model_loader=fake_model)  # the policy of each row's version
        node = _node(srv)
        a = node.heartbeat().assignments[0]
        node.submit(a.assignment_id, write(rollouts_for(node.node_id, a), tmp / "p.parquet"))
        [(_, v)] = val.run_once()
        assert v.accepted, v.reason
        by_name = {c.name: c for c in v.checks}
        assert by_name["toploc"].ok and not by_name["toploc"].skipped
        assert by_name["sampling"].ok and not by_name["sampling"].skipped
        assert seen[0] == ("model-v0", ("claim", 1.0, tokenizer().eos_token_id))
        assert calls == [("model-v0", len(seen), vcfg.toploc_batch_size)]  # every row of the file in one call
        fail_from["row"] = len(seen) + 1  # the next submission's second row fails
        node2 = _node(srv)
        a2 = node2.heartbeat().assignments[0]
        node2.submit(a2.assignment_id, write(rollouts_for(node2.node_id, a2), tmp / "p2.parquet"))
        [(_, v2)] = val.run_once()
        assert not v2.accepted and v2.reason == "toploc: row 1: proof mismatch at chunk 0"
    finally:
        del sys.modules["fake_toploc_mod"]
    # a missing module is a misconfiguration: an internal error (the node is not slashed, nothing is posted,
    # the submission stays pending), and the CLI refuses such a config at startup
    chk = lazy_check("toploc", "no_such_module_xyz:verify", lambda fn, m, r: fn(m, r))
    with pytest.raises(ImportError, match="no_such_module_xyz"):
        chk(None)
    node3 = _node(srv)
    a3 = node3.heartbeat().assignments[0]
    sid3 = node3.submit(a3.assignment_id, write(rollouts_for(node3.node_id, a3), tmp / "q.parquet")).submission_id
    from swarmrl.protocol.checks import default_checks
    from swarmrl.protocol.validator import config_problems

    broken = ValidatorConfig(run_secret="test-secret", work_dir=str(tmp / "v3"), toploc_check="no_such_module_xyz:verify")
    assert any("no_such_module_xyz" in p for p in config_problems(broken))
    with pytest.raises(ValueError, match="no_such_module_xyz"):  # refused at startup, by the class as by the CLI
        Validator(broken, client=object(), tokenizer=tokenizer(), model_loader=fake_model)
    # a module that goes missing after start: checks built from the broken config under a sound one
    strict = Validator(broken.model_copy(update={"toploc_check": ValidatorConfig().toploc_check}),
                       client=ValidatorClient(srv.url, keys["validator"]), checks=default_checks(broken),
                       tokenizer=tokenizer(), model_loader=fake_model)
    assert strict.run_once() == []
    assert strict.internal_errors == 1 and node3.submission(sid3).status == "pending"
    assert node3.ledger().status == "active"


def test_optimistic_mode_lists_pending(tmp_path):
    cfg, keys = make_cfg(tmp_path, optimistic=True)
    with running(cfg, run_sweeper=False) as srv:
        node = _node(srv)
        a = node.heartbeat().assignments[0]
        rep = node.submit(a.assignment_id, write(rollouts_for(node.node_id, a), tmp_path / "a.parquet"))
        lst = TrainerClient(srv.url, keys["trainer"]).accepted(0)
        assert lst.optimistic and [(x.submission_id, x.status) for x in lst.items] == [(rep.submission_id, "pending")]


def test_ejection_rejects_pending_work_and_frees_its_tasks(env):
    srv, keys, tmp, cfg = env
    val = _validator(srv, keys, tmp)
    tc = TrainerClient(srv.url, keys["trainer"])
    node = _node(srv)
    a0 = node.heartbeat().assignments[0]
    tc.set_step(1, 1)
    a1 = [x for x in node.heartbeat().assignments if x.step == 1][0]
    node.submit(a0.assignment_id, write(rollouts_for(node.node_id, a0, correct=False, forge_rewards=True),
                                        tmp / "bad.parquet"))
    node.submit(a1.assignment_id, write(rollouts_for(node.node_id, a1), tmp / "fine.parquet"))
    judged = val.run_once()  # the second verdict meets a 409 (node already ejected) and is skipped
    assert [v.accepted for _, v in judged] == [False]
    assert srv.orch.submissions.accepted(1).items == []
    honest = _node(srv)
    seeds = set()
    for _ in range(3):  # one reassignment per heartbeat
        seeds |= {x.seed for x in honest.heartbeat().assignments if x.reassigned_from == node.node_id}
    assert seeds == {a0.seed, a1.seed}


def test_thinking_budget_is_checked(env):
    """Assignments carry the budget, how it is stated and how it is scored; the validator accepts work that
    states and scores it as assigned, and rejects work that ignores the budget in the prompt or forges the
    length penalty (a zero penalty would make an over-long answer look as good as one within budget)."""
    srv, keys, tmp, cfg = env
    val = _validator(srv, keys, tmp)
    honest, bare, forger = _node(srv), _node(srv), _node(srv)
    a = honest.heartbeat().assignments[0]
    assert a.target_length in cfg.contract.budget.tiers and a.contract.budget == cfg.contract.budget
    rows = rollouts_for(honest.node_id, a)
    assert rows[0].length_penalty > 0 and tokenizer().decode(rows[0].prompt_ids).startswith(f"[{a.target_length}]")
    honest.submit(a.assignment_id, write(rows, tmp / "h.parquet"))
    [(_, v)] = val.run_once()
    assert v.accepted, v.reason
    b = bare.heartbeat().assignments[0]
    bare.submit(b.assignment_id, write(rollouts_for(bare.node_id, b, bare_prompt=True), tmp / "b.parquet"))
    [(_, v)] = val.run_once()
    assert not v.accepted and v.reason.startswith("tasks:") and "prompt tokens" in v.reason
    f = forger.heartbeat().assignments[0]
    forger.submit(f.assignment_id, write(rollouts_for(forger.node_id, f, length_penalty=0.0), tmp / "f.parquet"))
    [(_, v)] = val.run_once()
    assert not v.accepted and v.reason.startswith("rewards:") and "length_penalty 0" in v.reason
    assert honest.ledger().status == "active"
    assert bare.ledger().status == "ejected" and forger.ledger().status == "ejected"


def test_a_validator_that_cannot_run_its_model_checks_refuses_to_start(tmp_path):
    """Built in code with the default checks and no model, it used to log an error and then pass every skipped
    model check off as "all checks passed": refused at construction, as the CLI refuses it."""
    cfg = ValidatorConfig(run_secret="test-secret", work_dir=str(tmp_path / "v"))
    with pytest.raises(ValueError, match="no model_dir"):
        Validator(cfg, client=object(), tokenizer=tokenizer())
    assert Validator(cfg.model_copy(update={"cheap_checks_only": True}), client=object())  # said plainly
    assert Validator(cfg, client=object(), checks=model_free_checks(cfg), tokenizer=tokenizer())  # none needs one
    assert Validator(cfg, client=object(), tokenizer=tokenizer(), model_loader=fake_model)  # a model handed in
