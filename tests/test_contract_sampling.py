"""The sampling settings (temperature, top_p, token limits) are the run's contract (``RLContract.sampling``): an old
config's ``[rl.sampling]`` is refused with where it went, a node samples at its assignment's settings whatever its
own config says, and the validator holds every row to them (``check_schema``; the TOPLOC claim's top_p and limit)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from swarmrl.config import ConfigError, load_config
from swarmrl.contract import RLContract, Rollout
from swarmrl.envs import make_env
from swarmrl.inference.backend import InferenceBackend
from swarmrl.inference.params import SamplingParams
from swarmrl.inference.sampler import SampleOutput
from swarmrl.models import build_char_tokenizer
from swarmrl.protocol.check_config import sampling_claimer
from swarmrl.protocol.checks import CheckContext, check_schema, toploc_check
from swarmrl.protocol.config import ValidatorConfig
from swarmrl.protocol.schemas import AssignmentSpec, PendingSubmission, SubmissionInfo, TaskSpec
from swarmrl.rl.config import RLConfig
from swarmrl.rollouts.wire import read_rollouts, write_rollouts
from swarmrl.swarm.node import SwarmNode
from swarmrl.toploc.rollout import claim_from_rollout

NODE = "n" * 16


def _assignment(contract: RLContract, n: int = 1) -> AssignmentSpec:
    tasks = make_env(contract.task.name, **contract.task.params).sample(7, n)
    return AssignmentSpec(assignment_id=1, step=0, policy_version=0, seed=7, contract=contract, target_length=None,
                          tasks=[TaskSpec(task_id=t.task_id, prompt=t.prompt) for t in tasks])


def _ctx(a: AssignmentSpec, rows: list[Rollout], cfg: ValidatorConfig | None = None) -> CheckContext:
    sub = SubmissionInfo(submission_id=1, node_id=NODE, assignment_id=1, step=0, sha256="0" * 64, size=1,
                         n_rows=len(rows), status="pending", created_at=0.0)
    item = PendingSubmission(submission=sub, assignment=a, origin_node_id=NODE, current_step=0,
                             current_policy_version=0)
    return CheckContext(rows=rows, item=item, cfg=cfg or ValidatorConfig())


def _row(n_tokens: int, temperature: float = 1.0, mask: list[int] | None = None) -> Rollout:
    return Rollout(worker_id=NODE, step=0, policy_version=0, task_id="t", env="add", group_id="g", prompt_ids=[1, 2],
                   completion_ids=[3] * n_tokens, logprobs=[-0.5 * m for m in (mask or [1] * n_tokens)], reward=0.0, task_reward=0.0,
                   length_penalty=0.0, target_length=None, temperature=temperature, finished=False, seed=7,
                   completion_mask=mask)


def _through_the_wire(rows: list[Rollout], tmp_path: Path) -> list[Rollout]:
    """As the validator reads them: temperatures in float32, an all-model mask as None."""
    return read_rollouts(write_rollouts(rows, tmp_path / "rows.parquet"))


# ---- the config ----------------------------------------------------------------------------------------------------
def test_an_old_rl_sampling_section_is_refused_with_its_new_place(tmp_path):
    old = tmp_path / "old.toml"
    old.write_text("[sampling]\nmax_new_tokens = 16\ntemperature = 0.7\n")
    with pytest.raises(ConfigError, match=r"sampling -> contract\.sampling.*\[rl\.contract\.sampling\]"):
        load_config(RLConfig, old)
    new = tmp_path / "new.toml"
    new.write_text("[contract.sampling]\nmax_new_tokens = 16\ntemperature = 0.7\n")
    cfg = load_config(RLConfig, new)
    assert cfg.contract.sampling == SamplingParams(max_new_tokens=16, temperature=0.7)
    assert "sampling" not in RLConfig.model_fields


@pytest.mark.parametrize("bad", [{"temperature": float("inf")}, {"temperature": float("nan")},
                                 {"temperature": 1e9}, {"top_p": float("nan")}, {"max_new_tokens": 1 << 40},
                                 {"max_trajectory_tokens": 1 << 40}])
def test_the_contracts_sampling_is_bounded_on_the_wire(bad):
    c = RLContract().model_dump(mode="json")
    c["sampling"] = {**c["sampling"], **bad}
    with pytest.raises(ValidationError):
        RLContract.model_validate(c)


# ---- the validator -------------------------------------------------------------------------------------------------
def test_a_row_at_another_temperature_is_rejected_and_one_at_the_contracts_passes(tmp_path):
    a = _assignment(RLContract(sampling={"temperature": 0.7}))
    honest = _through_the_wire([_row(4, 0.7)], tmp_path)  # 0.7 in float32: not the float64 0.7
    assert honest[0].temperature != 0.7
    ok, reason = check_schema(_ctx(a, honest))
    assert ok, reason
    ok, reason = check_schema(_ctx(a, [_row(4, 0.7), _row(4, 0.7), _row(4, 1.0)]))
    assert not ok and reason == "row 2: sampled at temperature 1.0, the contract's is 0.7", reason
    ok, reason = check_schema(_ctx(a, [_row(4, float("nan"))]))
    assert not ok and "temperature nan" in reason


def test_a_row_over_the_contracts_token_limit_is_rejected(tmp_path):
    a = _assignment(RLContract(sampling={"max_new_tokens": 6}))
    assert check_schema(_ctx(a, _through_the_wire([_row(6)], tmp_path)))[0]
    ok, reason = check_schema(_ctx(a, [_row(6), _row(7)]))
    assert not ok and reason == "row 1: 7 tokens sampled by the model, over the contract's max_new_tokens = 6", reason


def test_a_multi_turn_rows_limit_is_its_trajectorys(tmp_path):
    """calc: 8 tokens per call, 20 per trajectory. A row whose tokens are all the model's reads back without a mask:
    the task, not the row, says it is multi-turn."""
    a = _assignment(RLContract(task={"name": "calc"}, sampling={"max_new_tokens": 8, "max_trajectory_tokens": 20}))
    mixed = [1] * 6 + [0] * 10 + [1] * 4
    rows = _through_the_wire([_row(20, mask=mixed), _row(12, mask=[1] * 12)], tmp_path)
    assert rows[1].completion_mask is None
    ok, reason = check_schema(_ctx(a, rows))
    assert ok, reason
    ok, reason = check_schema(_ctx(a, [_row(21, mask=[1] * 21)]))
    assert not ok and "21 tokens sampled by the model, over the contract's max_trajectory_tokens = 20" in reason
    # the environment's tokens are not the model's: 18 model tokens within 20 pass whatever the replies add
    assert check_schema(_ctx(a, [_row(30, mask=[1] * 9 + [0] * 12 + [1] * 9)]))[0]


def test_the_toploc_claim_gets_the_contracts_top_p_and_limit(monkeypatch):
    import swarmrl.protocol.checks as checks

    a = _assignment(RLContract(sampling={"top_p": 0.9, "max_new_tokens": 5}))
    ctx = _ctx(a, [_row(5)], ValidatorConfig(toploc_check="verify",
                                             sampling_claim="swarmrl.toploc.rollout:claim_from_rollout"))
    ctx.model_loader, ctx.tokenizer = (lambda v: "model"), build_char_tokenizer()
    claims: list = []

    def verify(model, items, batch_size=1, **kw):  # noqa: ANN001, ANN003, ANN202
        claims.extend(it[3] for it in items)
        return [(True, "")] * len(items)

    real = checks.import_dotted
    monkeypatch.setattr(checks, "import_dotted", lambda spec: verify if spec == "verify" else real(spec))
    ok, reason = toploc_check(ctx.cfg)(ctx)
    assert ok, reason
    [claim] = claims
    assert claim.top_p == 0.9 and claim.max_new_tokens == 5 and claim.temperature == 1.0
    # a claim function of (row, eos) alone still works; an episode's row claims no per-call limit
    s = a.contract.sampling
    assert sampling_claimer(lambda r, eos: ("claim", eos), 0, s, single=lambda r: True)(_row(3)) == ("claim", 0)
    assert sampling_claimer(claim_from_rollout, 0, s, single=lambda r: False)(_row(3)).max_new_tokens is None


# ---- the node ------------------------------------------------------------------------------------------------------
class RecordingBackend(InferenceBackend):
    """Answers every prompt with two tokens and EOS; records the sampling settings it was called with."""

    name = "recording"

    def __init__(self, eos_id: int, pad_id: int) -> None:
        super().__init__(eos_id, pad_id)
        self.params: list[SamplingParams] = []

    def generate(self, prompt_ids, params, *, seeds=None, capture_hidden=False):  # noqa: ANN001, ANN201
        self.params.append(params)
        n = len(prompt_ids)
        return SampleOutput([list(p) for p in prompt_ids], [[5, 6, self.eos_id]] * n, [[-0.5] * 3] * n, [True] * n)

    def update_weights(self, weights):  # noqa: ANN001, ANN201
        raise NotImplementedError


def test_a_node_samples_at_its_assignments_settings_whatever_its_own_config_says(tmp_path):
    tok = build_char_tokenizer()
    backend = RecordingBackend(tok.eos_token_id, tok.pad_token_id)
    node = SwarmNode.__new__(SwarmNode)  # what generate uses, without a policy source or an orchestrator
    node.node_id, node.work, node.tokenizer, node.envs, node.prefetcher = NODE, tmp_path, tok, {}, None
    node.rl = RLConfig(contract=RLContract(sampling={"temperature": 0.3, "max_new_tokens": 64, "top_p": 0.5}))
    node.policy = type("P", (), {"source": type("S", (), {"take_fetch_report": staticmethod(lambda: None)})()})()
    node.backend_for = lambda version: backend
    contract = RLContract(task={"name": "add", "params": {"digits": 2}}, group_size=2,
                          sampling={"temperature": 0.7, "max_new_tokens": 6})
    a = _assignment(contract, n=2)
    path, _ = node.generate(a)
    assert [p.model_dump() for p in backend.params] == [contract.sampling.model_dump()]
    rows = read_rollouts(path)
    assert len(rows) == 4
    ok, reason = check_schema(_ctx(a, rows))
    assert ok, reason


def test_a_validator_whose_contract_samples_otherwise_leaves_the_assignment_pending():
    from swarmrl.protocol.validator import contract_mismatch

    a = _assignment(RLContract(sampling={"temperature": 0.7}))
    item = _ctx(a, []).item
    assert contract_mismatch(ValidatorConfig(contract=RLContract(sampling={"temperature": 0.7})), item) is None
    why = contract_mismatch(ValidatorConfig(contract=RLContract()), item)
    assert why is not None and "sampling=" in why and "'temperature': 0.7" in why, why
