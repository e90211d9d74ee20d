"""The rollout row (one sampled completion, the unit every role exchanges) and how sampler output is packed
into scored rows: each completion is scored (``scoring``), and the sampling logprobs and TOPLOC proofs attached.
Nodes and local workers both build their rows here, so what a validator re-derives is exactly what a worker
claimed. Rows carry rewards, not advantages: the trainer computes those from the rewards by its loss's rule
(``swarmrl.rl.losses.advantages``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from swarmrl.contract.groups import is_informative
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


@dataclass(frozen=True)
class Samples:
    """The sampler's output for ``len(tasks) * group_size`` completions: task i's group sits at
    ``i * group_size + j`` of every list."""

    prompt_ids: Sequence[list[int]]
    completion_ids: Sequence[list[int]]
    logprobs: Sequence[list[float]]
    finished: Sequence[bool]
    proofs: Sequence[list[bytes]] | None = None  # TOPLOC proofs of each completion; None: none made
    masks: Sequence[list[int]] | None = None  # multi-turn trajectories' completion masks; None: every token sampled
    texts: Sequence[str] | None = None  # what the verifier scores for each; None: ``decode`` of its ids


@dataclass(frozen=True)
class RowOrigin:
    """Where a batch's rows come from, the same on each of them: who sampled them, for which step, with which
    policy version, from which task-assignment seed, at which temperature."""

    worker_id: str
    step: int
    policy_version: int
    seed: int
    temperature: float


def score_groups(*, env: Verifier, tasks: Sequence, budgets: Sequence[Budget | None], group_size: int,
                 samples: Samples, decode: Callable[[list[int]], str], origin: RowOrigin) -> ScoredBatch:
    """Rows for ``tasks``, each with ``group_size`` completions in ``samples`` (``budgets[i]``: task i's thinking
    budget or None). The verifier scores ``samples.texts`` where given (a verifiers environment's, scored on its
    conversation), else ``decode`` of each completion's ids. A thinking budget counts the model's tokens only."""
    g, out = group_size, samples
    if not (len(out.prompt_ids) == len(out.completion_ids) == len(out.logprobs) == len(out.finished)
            == len(tasks) * g):
        raise ValueError(f"sampler output holds {len(out.completion_ids)} completions for {len(tasks)} tasks x {g}")
    rows: list[Rollout] = []
    informative = tokens = 0
    for i, task in enumerate(tasks):
        budget = budgets[i]
        idx = range(i * g, (i + 1) * g)
        scores = []
        for j in idx:
            ids = out.completion_ids[j]
            tokens += len(ids)
            model_ids = ids if out.masks is None else [t for t, m in zip(ids, out.masks[j]) if m]
            text = decode(ids) if out.texts is None else out.texts[j]
            scores.append(score_completion(env, task, text, model_ids, out.finished[j], budget))
        informative += int(is_informative([s.reward for s in scores]))
        for s, j in zip(scores, idx):
            rows.append(Rollout(
                worker_id=origin.worker_id, step=origin.step, policy_version=origin.policy_version,
                task_id=task.task_id, env=task.env, group_id=f"{task.task_id}#{origin.seed}#{i}",
                prompt_ids=list(out.prompt_ids[j]), completion_ids=list(out.completion_ids[j]),
                logprobs=list(out.logprobs[j]), reward=s.reward, task_reward=s.task_reward,
                length_penalty=s.length_penalty, target_length=budget.target if budget is not None else None,
                temperature=origin.temperature, finished=bool(out.finished[j]), seed=origin.seed,
                proofs=list(out.proofs[j]) if out.proofs is not None else [],
                completion_mask=list(out.masks[j]) if out.masks is not None else None,
            ))
    return ScoredBatch(rows, informative, tokens)
