"""The rollout row (one sampled completion, the unit every role exchanges) and how sampler output is packed
into scored rows: per group, each completion is scored (``scoring``), the group's advantages computed
(``groups``), and the sampling logprobs and TOPLOC proofs attached. Nodes and local workers both build their
rows here, so what a validator re-derives is exactly what a worker claimed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from swarmrl.contract.groups import group_advantages, is_informative
from swarmrl.contract.scoring import Budget, Verifier, score_completion


@dataclass
class Rollout:
    worker_id: str
    step: int
    policy_version: int
    task_id: str
    env: str
    group_id: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    reward: float
    task_reward: float
    length_penalty: float
    advantage: float
    target_length: int | None
    temperature: float
    finished: bool
    seed: int
    proofs: list[bytes] = field(default_factory=list)
    # per completion token: 1 sampled by the model, 0 an environment's reply (multi-turn); None: all sampled
    completion_mask: list[int] | None = None

    def model_mask(self) -> list[int]:
        """The completion mask, all ones for a single-turn row."""
        return [1] * len(self.completion_ids) if self.completion_mask is None else list(self.completion_mask)

    def model_positions(self) -> list[int]:
        """Indices of the completion tokens the model sampled (what logprobs, proofs and the loss cover)."""
        return [i for i, m in enumerate(self.model_mask()) if m]


@dataclass
class ScoredBatch:
    rows: list[Rollout]
    informative: int  # groups whose rewards do not all tie
    tokens: int  # completion tokens generated


def score_groups(*, env: Verifier, tasks: Sequence, budgets: Sequence[Budget | None], group_size: int,
                 prompt_ids: Sequence[list[int]], completion_ids: Sequence[list[int]],
                 logprobs: Sequence[list[float]], finished: Sequence[bool], decode: Callable[[list[int]], str],
                 proofs: Sequence[list[bytes]] | None = None, worker_id: str, step: int, policy_version: int,
                 seed: int, temperature: float, use_std: bool = True,
                 masks: Sequence[list[int]] | None = None, texts: Sequence[str] | None = None) -> ScoredBatch:
    """Rows for ``tasks`` whose ``group_size`` completions each sit at ``i * group_size + j`` of the sampler's
    output lists (``budgets[i]``: task i's thinking budget or None; ``masks``: multi-turn trajectories' completion
    masks, None: every token sampled; ``texts``: what the verifier scores for each, None: ``decode`` of its ids,
    as for every environment but a verifiers one, scored on its conversation). A thinking budget counts the
    model's tokens only."""
    g = group_size
    if not (len(prompt_ids) == len(completion_ids) == len(logprobs) == len(finished) == len(tasks) * g):
        raise ValueError(f"sampler output holds {len(completion_ids)} completions for {len(tasks)} tasks x {g}")
    rows: list[Rollout] = []
    informative = tokens = 0
    for i, task in enumerate(tasks):
        budget = budgets[i]
        idx = range(i * g, (i + 1) * g)
        scores = []
        for j in idx:
            tokens += len(completion_ids[j])
            model_ids = completion_ids[j] if masks is None else [t for t, m in zip(completion_ids[j], masks[j]) if m]
            text = decode(completion_ids[j]) if texts is None else texts[j]
            scores.append(score_completion(env, task, text, model_ids, finished[j], budget))
        rewards = [s.reward for s in scores]
        adv = group_advantages(rewards, use_std=use_std)
        informative += int(is_informative(rewards))
        for k, j in enumerate(idx):
            rows.append(Rollout(
                worker_id=worker_id, step=step, policy_version=policy_version, task_id=task.task_id, env=task.env,
                group_id=f"{task.task_id}#{seed}#{i}", prompt_ids=list(prompt_ids[j]),
                completion_ids=list(completion_ids[j]), logprobs=list(logprobs[j]), reward=scores[k].reward,
                task_reward=scores[k].task_reward, length_penalty=scores[k].length_penalty, advantage=adv[k],
                target_length=budget.target if budget is not None else None, temperature=temperature,
                finished=bool(finished[j]), seed=seed, proofs=list(proofs[j]) if proofs is not None else [],
                completion_mask=list(masks[j]) if masks is not None else None,
            ))
    return ScoredBatch(rows, informative, tokens)
