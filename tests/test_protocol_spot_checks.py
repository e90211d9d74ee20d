"""Sampled validation (``swarmrl.protocol.spot_checks``): the model checks run on a secret, unpredictable share of
submissions (and every node's first ones), the cheap checks on all of them; a sampled-out cheater accepted at
first is caught by an audit and slashed as a challenge; the stake arithmetic is enforced."""

from __future__ import annotations

import secrets
import sys
import types
from pathlib import Path

import pytest
from protocol_support import fake_model, make_cfg, rollouts_for, running, tokenizer, write

from swarmrl.contract import RLContract
from swarmrl.envs.config import TaskConfig
from swarmrl.protocol.client import NodeClient, TrainerClient, ValidatorClient
from swarmrl.protocol.config import ValidatorConfig
from swarmrl.protocol.schemas import AssignmentSpec, PendingSubmission, SubmissionInfo
from swarmrl.protocol.signing import generate_key
from swarmrl.protocol.spot_checks import SAMPLED_CHECKS, cheating_margin, draw, min_stake
from swarmrl.protocol.validator import Validator

CHEAT = -0.5  # rows with these logprobs fail the (fake) model check, as tokens not sampled from the policy do


def _fake_toploc(model, items, batch_size=1):  # noqa: ANN001, ANN202 - one result per row, like verify_rollouts
    return [types.SimpleNamespace(passed=claim != CHEAT, reason="proof mismatch at chunk 0",
                                  sampling=None) for _, _, _, claim in items]


@pytest.fixture()
def fake_model_checks():
    mod = types.ModuleType("fake_sampled_toploc")
    mod.verify = _fake_toploc
    mod.claim = lambda row, eos: row.logprobs[0]
    sys.modules[mod.__name__] = mod
    yield {"toploc_check": "fake_sampled_toploc:verify", "sampling_claim": "fake_sampled_toploc:claim",
           "logprob_rows": 0}
    del sys.modules[mod.__name__]


@pytest.fixture()
def env(tmp_path):
    cfg, keys = make_cfg(tmp_path, slash_fraction=0.5)
    with running(cfg, run_sweeper=False) as srv:
        yield srv, keys, tmp_path, cfg


def _validator(srv, keys, tmp, name="val", **kw) -> Validator:  # noqa: ANN001
    vcfg = ValidatorConfig(run_secret="test-secret", work_dir=str(tmp / name), **kw)
    return Validator(vcfg, client=ValidatorClient(srv.url, keys["validator"]), tokenizer=tokenizer(),
                     model_loader=fake_model)


def _node(srv) -> NodeClient:  # noqa: ANN001
    n = NodeClient(srv.url, generate_key())
    n.register(throughput=10.0, stake=200.0)
    return n


def _submit(node, tmp, name, **kw) -> int:  # noqa: ANN001
    a = max(node.heartbeat().assignments, key=lambda x: x.step)
    rows = rollouts_for(node.node_id, a, **{k: v for k, v in kw.items() if k != "cheat"})
    if kw.get("cheat"):
        for r in rows:
            r.logprobs = [CHEAT] * len(r.completion_ids)
    return node.submit(a.assignment_id, write(rows, tmp / f"{name}.parquet")).submission_id


def test_sampled_out_cheater_is_accepted_then_caught_by_audit_and_slashed(env, fake_model_checks):
    srv, keys, tmp, cfg = env
    val = _validator(srv, keys, tmp, full_check_rate=0.0, full_check_first=1, audit_rate=1.0, **fake_model_checks)
    node = _node(srv)
    s0 = _submit(node, tmp, "honest")
    [(sid, v0)] = val.run_once()
    assert sid == s0 and v0.accepted and v0.reason == "all checks passed"  # the node's first: in full
    assert not any("sampled out" in c.reason for c in v0.checks)
    assert [c.name for c in v0.checks if not c.skipped] == ["schema", "seed", "tasks", "policy", "proofs", "replay",
                                                            "toploc", "rewards"]  # (logprobs off, no sampling claims here)
    assert val.audit_once() == []  # nothing queued: it was checked in full
    TrainerClient(srv.url, keys["trainer"]).set_step(1, 1)
    s1 = _submit(node, tmp, "cheat", cheat=True)
    [(sid, v1)] = val.run_once()
    assert sid == s1 and v1.accepted, v1.reason  # sampled out: the model checks did not run, so not seen yet
    skipped = {c.name: c.reason for c in v1.checks if c.skipped}
    assert set(skipped) == set(SAMPLED_CHECKS) and all("sampled out" in r for r in skipped.values())
    ran = [c.name for c in v1.checks if not c.skipped]
    assert ran == ["schema", "seed", "tasks", "policy", "proofs", "replay", "rewards"]  # every cheap check still ran
    locked = node.ledger().credits_locked
    assert locked == 2 * cfg.credit_per_sample * 3 * 2 and node.submission(s1).status == "accepted"
    [(sid, audit)] = val.audit_once()  # the validator is idle: the audit judges it in full
    assert sid == s1 and not audit.accepted and audit.reason.startswith("toploc: row 0: proof mismatch")
    detail = node.submission(s1)
    assert detail.status == "rejected" and detail.reason.startswith("audit: toploc:")
    bal = node.ledger()
    assert bal.status == "ejected" and bal.stake == pytest.approx(100.0)  # slashed as a challenge
    assert bal.credits_locked == 0.0  # both credits in the window revoked, the honest one too
    assert val.sampling["challenged"] == 1 and val.sampling["sampled_out"] == 1 and val.sampling["full"] == 1


def test_sampled_out_work_still_gets_every_cheap_check(env, fake_model_checks):
    srv, keys, tmp, cfg = env
    val = _validator(srv, keys, tmp, full_check_rate=0.0, full_check_first=0, audit_rate=0.0, **fake_model_checks)
    forger = _node(srv)
    _submit(forger, tmp, "forged", correct=False, forge_rewards=True)
    [(_, v)] = val.run_once()
    assert not v.accepted and v.reason.startswith("rewards:")  # sampled out, rejected by the reward re-check
    assert forger.ledger().status == "ejected"
    stale = _node(srv)
    _submit(stale, tmp, "stale", policy_version=7)
    [(_, v)] = val.run_once()
    assert not v.accepted and v.reason.startswith("policy:")
    # no audits queued at audit_rate 0; the honest, sampled-out one is accepted on the cheap checks
    honest = _node(srv)
    _submit(honest, tmp, "fine")
    [(_, v)] = val.run_once()
    assert v.accepted and v.reason.startswith("cheap checks passed") and val.audit_once() == []


def _item(sid: int, sha: str, node: str = "n") -> PendingSubmission:
    a = AssignmentSpec(assignment_id=sid, step=0, policy_version=0, seed=1, contract=RLContract(task=TaskConfig(name="add", params={}), group_size=2), tasks=[],
                       target_length=None)
    s = SubmissionInfo(submission_id=sid, node_id=node, assignment_id=sid, step=0, sha256=sha, size=1, n_rows=4,
                       status="pending", created_at=0.0)
    return PendingSubmission(submission=s, assignment=a, origin_node_id=node, current_step=0,
                             current_policy_version=0)


def test_sample_rate_is_respected_and_the_draw_is_keyed(tmp_path):
    n, p = 4000, 0.25
    subs = [(i, secrets.token_hex(32)) for i in range(n)]
    k1, k2 = secrets.token_bytes(32), secrets.token_bytes(32)
    full1 = [draw(k1, "full", i, h) < p for i, h in subs]
    full2 = [draw(k2, "full", i, h) < p for i, h in subs]
    sd = (p * (1 - p) / n) ** 0.5
    assert abs(sum(full1) / n - p) < 4 * sd and abs(sum(full2) / n - p) < 4 * sd
    # the node knows its file and id but not the key: under another key the decisions are independent
    # (agreement p^2 + (1-p)^2 = 0.625, not 1), so nothing about the file itself decides the sample
    agree = sum(a == b for a, b in zip(full1, full2)) / n
    assert abs(agree - (p * p + (1 - p) ** 2)) < 0.05
    assert full1 == [draw(k1, "full", i, h) < p for i, h in subs]  # deterministic under one key (retries agree)
    audit = [draw(k1, "audit", i, h) < p for i, h in subs]
    assert abs(sum(a == b for a, b in zip(full1, audit)) / n - 0.625) < 0.05  # the audit draw is its own
    # the validator: a node's first full_check_first always in full, then the rate
    cfg = ValidatorConfig(work_dir=str(tmp_path / "v"), full_check_rate=p, full_check_first=3,
                          sample_key=k1.hex(), logprob_rows=0)
    val = Validator(cfg, client=object(), checks=[])
    val._seen["n"] = 2
    assert all(val.sampled_out(_item(i, h)) == "" for i, h in subs[:200])
    val._seen["n"] = 3
    out = [val.sampled_out(_item(i, h)) for i, h in subs]
    assert [o == "" for o in out] == full1
    val._seen["m"] = 0
    assert all(val.sampled_out(_item(i, h, node="m")) == "" for i, h in subs[:50])
    every = Validator(cfg.model_copy(update={"full_check_rate": 1.0}), client=object(), checks=[])
    every._seen["n"] = 10
    assert all(every.sampled_out(_item(i, h)) == "" for i, h in subs[:200])


def test_stake_arithmetic_and_run_config_refuses_a_losing_sample_rate():
    # G = 128 credits per submission, S = 0.5 x stake
    assert min_stake(0.25, 0.5, 128.0) == pytest.approx(512.0)
    assert cheating_margin(0.25, 512.0, 0.5, 128.0) == pytest.approx(1.0)
    assert cheating_margin(0.25, 1000.0, 0.5, 128.0) == pytest.approx(0.25 * 628 / 96)
    assert cheating_margin(1.0, 0.0, 0.5, 128.0) == float("inf") and min_stake(0.5, 0.5, 128.0) == 0.0
    from swarmrl.config import load_config
    from swarmrl.job import RunConfig

    base = ['mode="swarm"', "rl.workers.prompts_per_batch=16", "rl.contract.group_size=8"]
    ok = load_config(RunConfig, None, [*base, "swarm.full_check_rate=0.25", "swarm.stake=1000"])
    assert ok.swarm.full_check_rate == 0.25
    with pytest.raises(Exception, match="at least 512"):
        load_config(RunConfig, None, [*base, "swarm.full_check_rate=0.25", "swarm.stake=100"])
    load_config(RunConfig, None, [*base, "swarm.stake=100"])  # full checks: any stake
    from swarmrl.job.derive import Identity, derive_swarm
    from swarmrl.protocol.signing import public_key_hex

    def ident(name: str) -> Identity:
        h = public_key_hex(generate_key())
        return Identity(f"/keys/{name}.pem", h, h[:32])

    plan = derive_swarm(ok, Path("/tmp/x"), 1, "s" * 32, ident("v"), ident("t"), {n: ident(n) for n in ("n0", "n1")},
                        ident("a"))
    assert (plan.validator.full_check_rate, plan.validator.audit_rate, plan.validator.full_check_first) == (0.25, 0.25, 2)
