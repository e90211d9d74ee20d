"""A worker batch: scored groups with consistent rewards (no advantages: the trainer computes those) and TOPLOC
proofs that verify."""

import torch

from swarmrl.contract import RLContract
from swarmrl.envs import make_env
from swarmrl.generation.batch import BatchOrigin, rollout_batch
from swarmrl.models import load_model, load_tokenizer
from swarmrl.rl.config import RLConfig
from swarmrl.toploc import verify_rows


def test_batch_rows_and_proofs_verify(tiny_model_dir):
    model, tok = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    env = make_env("add", digits=2)
    cfg = RLConfig(contract=RLContract(group_size=4, task={"name": "add", "params": {"digits": 2}}))
    tasks = env.sample(3, 5)
    res = rollout_batch(model, tok, env, tasks, contract=cfg.contract, sampling=cfg.contract.sampling,
                        origin=BatchOrigin("w0", 2, 1, 3), budgets=None,
                        generator=torch.Generator().manual_seed(0), proofs=True)
    assert len(res.rows) == 20
    for i in range(5):
        g = res.rows[4 * i: 4 * i + 4]
        assert len({r.group_id for r in g}) == 1 and {r.task_id for r in g} == {tasks[i].task_id}
        assert all(not hasattr(r, "advantage") for r in g)  # the trainer's, from the rewards (rl.losses)
    for r in res.rows:
        assert r.step == 2 and r.policy_version == 1 and r.length_penalty == 0.0 and r.reward == r.task_reward
        assert len(r.logprobs) == len(r.completion_ids) and r.proofs
        assert r.finished == (r.completion_ids[-1] == tok.eos_token_id)
    checks = verify_rows(model, res.rows, tok.eos_token_id, max_new_tokens=cfg.contract.sampling.max_new_tokens)
    assert all(c.passed for c in checks), [c.reason for c in checks if not c.passed]
    # a token edited after generation is caught
    bad = res.rows[0]
    bad.completion_ids = [(bad.completion_ids[0] + 1) % 200 + 4] + bad.completion_ids[1:]
    assert not verify_rows(model, [bad], tok.eos_token_id, max_new_tokens=cfg.contract.sampling.max_new_tokens)[0].passed


def test_budget_targets_and_penalties(tiny_model_dir):
    model, tok = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    env = make_env("add", digits=2)
    cfg = RLConfig(contract=RLContract(group_size=2, budget={"enabled": True, "tiers": [3], "penalty": 0.1}))
    res = rollout_batch(model, tok, env, env.sample(0, 3), contract=cfg.contract, sampling=cfg.contract.sampling,
                        origin=BatchOrigin("w0", 0, 0, 0),
                        budgets=[cfg.contract.budget.budget(3)] * 3, generator=torch.Generator().manual_seed(0))
    for r in res.rows:
        n = len(r.completion_ids) - (1 if r.finished else 0)
        assert r.target_length == 3
        assert abs(r.length_penalty - 0.1 * abs(3 - n)) < 1e-6
        assert abs(r.reward - (r.task_reward - r.length_penalty)) < 1e-6
        assert tok.decode(r.prompt_ids).startswith("[3]")
