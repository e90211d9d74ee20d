"""Rollouts an honest node makes for an assignment with a real model: sampled with the policy, scored with
the env verifier under the assigned thinking budget, at the assignment's sampling settings (``contract.sampling``),
with TOPLOC proofs (as swarm.node does)."""

from __future__ import annotations

from pathlib import Path

import torch

from swarmrl.contract import Rollout, completion_length, format_prompt
from swarmrl.envs import make_env
from swarmrl.inference.prompts import decode_completion
from swarmrl.inference.sampler import generate
from swarmrl.models import load_model, load_tokenizer
from swarmrl.toploc import build_proofs


def _shown(prompt: str, a) -> str:  # noqa: ANN001
    return format_prompt(prompt, a.budget())


_CACHE: dict[str, tuple] = {}


def policy(model_dir: Path) -> tuple:
    key = str(model_dir)
    if key not in _CACHE:
        _CACHE[key] = (load_model(model_dir), load_tokenizer(model_dir))
    return _CACHE[key]


def honest_rows(model_dir: Path, node_id: str, a, seed: int = 0) -> list[Rollout]:  # noqa: ANN001
    model, tok = policy(model_dir)
    env = make_env(a.contract.task.name, **a.contract.task.params)
    tasks = env.sample(a.seed, len(a.tasks))
    shown = [_shown(t.prompt, a) if a.target_length is not None else t.prompt for t in tasks]
    prompts = [tok.encode(p, add_special_tokens=False) for p in shown for _ in range(a.contract.group_size)]
    out = generate(model, prompts, a.contract.sampling, tok.eos_token_id,
                   tok.pad_token_id, capture_hidden=True, generator=torch.Generator().manual_seed(seed))
    rows = []
    for i, (p, c, lp, fin, h) in enumerate(zip(out.prompt_ids, out.completion_ids, out.logprobs, out.finished,
                                               out.hidden)):
        t = tasks[i // a.contract.group_size]
        r = float(env.verify(t, decode_completion(tok, c)))
        pen = 0.0 if a.target_length is None else a.contract.budget.penalty * abs(a.target_length - completion_length(c, fin))
        rows.append(Rollout(worker_id=node_id, step=a.step, policy_version=a.policy_version, task_id=t.task_id,
                            env=a.contract.task.name, group_id=f"{a.assignment_id}-{i // a.contract.group_size}", prompt_ids=p,
                            completion_ids=c, logprobs=lp, reward=r - pen, task_reward=r, length_penalty=pen,
                            target_length=a.target_length, temperature=a.contract.sampling.temperature, finished=fin, seed=a.seed,
                            proofs=build_proofs(h)))
    return rows


def row(**kw) -> Rollout:
    """One legal rollout row (fields overridable): the unit the attack tests bend."""
    base = dict(worker_id="w0", step=5, policy_version=4, task_id="t", env="add", group_id="g0",
                prompt_ids=[1, 2, 3], completion_ids=[4, 2], logprobs=[-0.5, -0.125], reward=1.0, task_reward=1.0,
                length_penalty=0.0, target_length=None, temperature=1.0, finished=True, seed=9,
                proofs=[])
    base.update(kw)
    return Rollout(**base)
