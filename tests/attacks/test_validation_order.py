"""Validation order: cheapest first. A submission that fails a cheap check (schema, seed, tasks, policy window,
TOPLOC proof shape) never costs a model load, a forward pass, a verifier call or a sandbox run; the model
checks come next and the rewards (env verifiers, the code sandbox) last."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from protocol_support import make_cfg, running, write

from attacks._honest import honest_rows
from swarmrl.envs import make_env
from swarmrl.protocol.client import NodeClient, ValidatorClient
from swarmrl.protocol.config import ValidatorConfig
from swarmrl.protocol.signing import generate_key
from swarmrl.protocol.validator import Validator, default_checks

ORDER = ["schema", "seed", "tasks", "policy", "proofs", "replay", "logprobs", "toploc", "sampling", "rewards"]


def test_default_order_is_cheapest_first():
    assert [name for name, _ in default_checks(ValidatorConfig())] == ORDER


class Counted:
    """The validator with its model loads and the env verifier's calls counted."""

    def __init__(self, srv, keys, tmp: Path, model_dir: Path, monkeypatch) -> None:  # noqa: ANN001
        cfg = ValidatorConfig(run_secret="test-secret", work_dir=str(tmp / "val"), model_dir=str(model_dir))
        self.val = Validator(cfg, client=ValidatorClient(srv.url, keys["validator"]))
        self.loads: list[int] = []
        real_load = self.val.load_model

        def load(version: int):  # noqa: ANN202
            self.loads.append(version)
            return real_load(version)

        self.val.load_model = load
        self.verifies = 0
        env_cls = type(make_env("mul_add"))
        real_verify = env_cls.verify

        def verify(env, task, completion):  # noqa: ANN001, ANN202
            self.verifies += 1
            return real_verify(env, task, completion)

        monkeypatch.setattr(env_cls, "verify", verify)


@pytest.fixture()
def swarm(tmp_path, tiny_model_dir, monkeypatch):
    cfg, keys = make_cfg(tmp_path, tasks_per_node=2, contract={"group_size": 2, "async_level": 1})
    with running(cfg, run_sweeper=False) as srv:
        yield srv, keys, tmp_path, Counted(srv, keys, tmp_path, tiny_model_dir, monkeypatch)


def _submit(srv, tmp: Path, model_dir: Path, name: str, edit) -> NodeClient:  # noqa: ANN001
    n = NodeClient(srv.url, generate_key())
    n.register(throughput=10.0, stake=200.0)
    a = n.heartbeat().assignments[0]
    rows = honest_rows(model_dir, n.node_id, a, seed=len(name))
    edit(rows)
    n.submit(a.assignment_id, write(rows, tmp / f"{name}.parquet"))
    return n


def _set(field: str, value):  # noqa: ANN001, ANN202
    def edit(rows) -> None:  # noqa: ANN001
        for r in rows:
            setattr(r, field, value(r) if callable(value) else value)
    return edit


def _short_proof(rows) -> None:  # noqa: ANN001
    rows[1].proofs = [rows[1].proofs[0][:-2]] + rows[1].proofs[1:]  # one proof 2 bytes short


def _extra_proof(rows) -> None:  # noqa: ANN001
    rows[0].proofs = rows[0].proofs + rows[0].proofs[-1:]


def _bad_modulus(rows) -> None:  # noqa: ANN001
    p = bytearray(rows[0].proofs[0])
    p[0:2] = (5).to_bytes(2, "big")  # index modulus 5 < k
    rows[0].proofs = [bytes(p)] + rows[0].proofs[1:]


CHEAP_FAILURES = {
    "wrong seed in the rows": ("schema", _set("seed", lambda r: r.seed + 1)),
    "token past the vocabulary": ("schema", lambda rows: setattr(rows[0], "completion_ids",
                                                                 rows[0].completion_ids[:-1] + [99_999])),
    "edited prompt": ("tasks", lambda rows: setattr(rows[0], "prompt_ids", rows[0].prompt_ids + [5])),
    "unpublished policy version": ("policy", _set("policy_version", 1)),
    "a proof too short": ("proofs", _short_proof),
    "one proof too many": ("proofs", _extra_proof),
    "a malformed proof header": ("proofs", _bad_modulus),
}


@pytest.mark.parametrize("case", sorted(CHEAP_FAILURES))
def test_a_cheap_failure_never_reaches_the_expensive_checks(swarm, tiny_model_dir, case):
    srv, keys, tmp, counted = swarm
    check, edit = CHEAP_FAILURES[case]
    node = _submit(srv, tmp, tiny_model_dir, "bad", edit)
    counted.verifies = 0  # making the rows called the verifier too
    [(_, v)] = counted.val.run_once()
    assert not v.accepted and v.reason.startswith(f"{check}:"), v.reason
    ran = [c.name for c in v.checks]
    assert ran == ORDER[: ORDER.index(check) + 1], ran
    assert counted.loads == [], "a model was loaded for a submission that failed a cheap check"
    assert counted.verifies == 0, "the reward verifier ran for a submission that failed a cheap check"
    assert node.ledger().status == "ejected"


def test_honest_work_runs_every_check_in_order(swarm, tiny_model_dir):
    """The counters are not vacuous: honest work loads the model and calls the verifier, once all else passed."""
    srv, keys, tmp, counted = swarm
    node = _submit(srv, tmp, tiny_model_dir, "ok", lambda rows: None)
    counted.verifies = 0  # making the rows called the verifier too
    [(_, v)] = counted.val.run_once()
    assert v.accepted, v.reason
    assert [c.name for c in v.checks] == ORDER and not any(c.skipped for c in v.checks)
    assert counted.loads and counted.verifies == 4
    assert node.ledger().status == "active"


def test_proof_shape_findings():
    """The shape check on its own: counts per completion length, sizes, headers; rows without proofs only
    under require_proofs."""
    import torch

    from swarmrl.contract import Rollout
    from swarmrl.protocol.checks import CheckContext, check_proofs
    from swarmrl.toploc import build_proofs

    def row(n_tokens: int, proofs: list[bytes]) -> Rollout:
        return Rollout(worker_id="n", step=0, policy_version=0, task_id="t", env="mul_add", group_id="g",
                       prompt_ids=[1, 2], completion_ids=[3] * n_tokens, logprobs=[-0.1] * n_tokens, reward=0.0,
                       task_reward=0.0, length_penalty=0.0, target_length=None, temperature=1.0,
                       finished=False, seed=0, proofs=proofs)

    hidden = torch.randn(40, 64)
    good = build_proofs(hidden)  # 40 positions: 2 chunks of 32
    assert len(good) == 2 and all(len(p) == 258 for p in good)

    from swarmrl.contract import RLContract
    from swarmrl.protocol.schemas import AssignmentSpec, PendingSubmission, SubmissionInfo

    a = AssignmentSpec(assignment_id=1, step=0, policy_version=0, seed=1, contract=RLContract(), target_length=None,
                       tasks=[])
    sub = SubmissionInfo(submission_id=1, node_id="n", assignment_id=1, step=0, sha256="0" * 64, size=1, n_rows=1,
                         status="pending", created_at=0.0)
    item = PendingSubmission(submission=sub, assignment=a, origin_node_id="n", current_step=0, current_policy_version=0)

    def run(rows, **kw):  # noqa: ANN001, ANN202
        return check_proofs(CheckContext(rows=rows, item=item, cfg=ValidatorConfig(**kw)))

    assert run([row(40, good), row(40, [])])[0]
    ok, why = run([row(40, good), row(40, [])], require_proofs=True)
    assert not ok and "row 1: no TOPLOC proofs" in why
    ok, why = run([row(33, good[:1])])
    assert not ok and "1 TOPLOC proofs for 33 completion tokens (expected 2" in why
    ok, why = run([row(40, [good[0], good[1] + b"\0"])])
    assert not ok and "proof 1 is 259 bytes, expected 258" in why
    ok, why = run([row(40, [good[0], bytes(258)])])
    assert not ok and "malformed TOPLOC proof" in why
    big = bytearray(good[1])
    big[2:4] = (65497).to_bytes(2, "big")  # coefficient 0 = p
    ok, why = run([row(40, [good[0], bytes(big)])])
    assert not ok and "row 0: malformed" in why
    assert json.dumps(why)  # plain text, safe to post
