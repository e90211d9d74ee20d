"""One batch of groups: sample, score, prove (``rollout_batch``).

A task's ``group_size`` completions are sampled from one prompt (stated as the contract says: chat template,
thinking budget); a multi-turn environment's tasks turn by turn (``swarmrl.episodes.turns``: rows with a completion
mask, proofs over the model's tokens); a verifiers environment's (``vf:``) as episodes over the chat endpoint
(``swarmrl.episodes.vf.sample_episodes``: rows with a completion mask, scored on their conversation, no thinking
budgets). Every completion is then scored and packed into a row by ``contract.score_groups``, the rule the validator
re-derives, with TOPLOC proofs built from the final-norm states captured while sampling (no second pass).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from swarmrl.contract import Budget, RLContract, Rollout, RowOrigin, Samples, format_prompt, score_groups
from swarmrl.envs.base import Environment, Task
from swarmrl.envs.multiturn import is_multiturn
from swarmrl.envs.vf import is_verifiers_env
from swarmrl.episodes.turns import sample_turns
from swarmrl.inference.backend import InferenceBackend, as_backend
from swarmrl.inference.params import SamplingParams
from swarmrl.inference.prompts import decode_completion, encode_prompt
from swarmrl.toploc import build_proofs_many


@dataclass(frozen=True)
class BatchOrigin:
    """What a batch is for: who samples it, for which trainer step, with which policy version, from which
    task-assignment seed (its rows' ``RowOrigin``, with the sampling temperature)."""

    worker_id: str
    step: int
    policy_version: int
    seed: int

    def rows(self, temperature: float) -> RowOrigin:
        return RowOrigin(self.worker_id, self.step, self.policy_version, self.seed, temperature)


@dataclass
class BatchResult:
    rows: list[Rollout]
    informative: int  # groups whose rewards do not all tie
    tokens: int  # completion tokens generated
    seconds: float
    reward_mean: float
    task_reward_mean: float


def rollout_batch(policy: InferenceBackend | torch.nn.Module, tokenizer, env: Environment, tasks: list[Task], *,  # noqa: ANN001
                  contract: RLContract, sampling: SamplingParams, origin: BatchOrigin,
                  budgets: list[Budget | None] | None = None, generator: torch.Generator | None = None,
                  proofs: bool = False) -> BatchResult:
    """Rows for ``contract.group_size`` completions of each task (task i under ``budgets[i]``, None: no budget),
    sampled with ``sampling`` under ``contract`` (group size, chat template, proof geometry: a node passes its
    assignment's, a local worker the run's); with ``proofs``, TOPLOC proofs at ``contract.proof``. ``policy``: an
    inference backend, or an in-memory model sampled with ``ours`` from ``generator`` (a backend has its own random
    stream)."""
    if generator is not None and isinstance(policy, InferenceBackend):
        raise ValueError("generator is for an in-memory model; a backend samples from its own stream")
    backend = as_backend(policy, tokenizer.eos_token_id, tokenizer.pad_token_id, generator)
    t0 = time.perf_counter()
    budgets = list(budgets) if budgets is not None else [None] * len(tasks)
    per_completion = [t for t in tasks for _ in range(contract.group_size)]
    masks = texts = None
    if is_verifiers_env(env):  # episodes over the chat endpoint (swarmrl.episodes.vf), their own prompts
        out = _verifiers_episodes(backend, tokenizer, env, per_completion, budgets, sampling, proofs)
        masks, texts = out.masks, out.texts
    else:
        prompts = [encode_prompt(tokenizer, format_prompt(t.prompt, b), contract.chat_template)
                   for t, b in zip(tasks, budgets)]
        flat = [p for p in prompts for _ in range(contract.group_size)]
        if is_multiturn(env):  # the model's turns and the environment's replies, one token sequence each
            out = sample_turns(backend, tokenizer, env, per_completion, flat, sampling, capture_hidden=proofs)
            masks = out.masks
        else:
            out = backend.generate(flat, sampling, capture_hidden=proofs)
    samples = Samples(out.prompt_ids, out.completion_ids, out.logprobs, out.finished,
                      proofs=build_proofs_many(out.hidden, contract.proof) if proofs else None, masks=masks,
                      texts=texts)
    scored = score_groups(env=env, tasks=tasks, budgets=budgets, group_size=contract.group_size, samples=samples,
                          decode=lambda ids: decode_completion(tokenizer, ids), origin=origin.rows(sampling.temperature))
    rows = scored.rows
    n = len(rows)
    return BatchResult(rows, scored.informative, scored.tokens, time.perf_counter() - t0,
                       sum(r.reward for r in rows) / n, sum(r.task_reward for r in rows) / n)


def _verifiers_episodes(backend: InferenceBackend, tokenizer, env: Environment, tasks: list[Task],  # noqa: ANN001
                        budgets: list[Budget | None], sampling: SamplingParams, proofs: bool):  # noqa: ANN202
    """Verifiers episodes of ``tasks`` (one per completion), with each completion's model-token states in one
    tensor, as for our multi-turn trajectories."""
    if any(b is not None for b in budgets):
        raise ValueError(f"{env.name}: thinking budgets do not apply to verifiers episodes")
    from swarmrl.episodes.vf import sample_episodes  # noqa: PLC0415  # lazy: the optional verifiers extra

    out = sample_episodes(backend, tokenizer, env, tasks, sampling, capture_hidden=proofs)
    if out.hidden is not None:
        out.hidden = [torch.cat(h) if h else torch.empty(0) for h in out.hidden]
    return out


__all__ = ["BatchOrigin", "BatchResult", "rollout_batch"]
