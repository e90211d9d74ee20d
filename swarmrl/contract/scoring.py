"""How a completion is scored, the same on the node that claims it and on the validator that re-checks it.

    reward = task_reward - length_penalty
    length_penalty = penalty * |target - length|   (with a thinking budget; 0 without)
    length = completion tokens, the closing EOS excluded

A thinking budget is stated in the prompt with a format holding ``{prompt}`` once and ``{target}``.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class Verifier(Protocol):
    def verify(self, task, completion: str) -> float: ...  # noqa: ANN001


def check_prompt_format(fmt: str) -> str:
    """A budget prompt format must use exactly the fields {target} and {prompt} (and may not do anything else)."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(fmt) if f is not None]
    except ValueError as e:
        raise ValueError(f"bad prompt format {fmt!r}: {e}") from None
    if sorted(set(fields)) != ["prompt", "target"] or fields.count("prompt") != 1:  # before formatting anything
        raise ValueError(f"prompt format {fmt!r} must contain {{prompt}} once and {{target}}, and no other field")
    try:
        fmt.format(target=1, prompt="p")
    except Exception as e:  # e.g. a format spec that does not apply to the value
        raise ValueError(f"bad prompt format {fmt!r}: {e}") from None
    return fmt


@dataclass(frozen=True)
class Budget:
    """A thinking budget as one assignment (or one local group) carries it."""

    target: int
    penalty: float
    prompt_format: str = "[{target}]{prompt}"


def format_prompt(prompt: str, budget: Budget | None) -> str:
    """The prompt text as the model sees it (under a thinking budget: the budget's prompt format)."""
    if budget is None:
        return prompt
    return budget.prompt_format.format(target=budget.target, prompt=prompt)


def completion_length(completion_ids: Sequence[int], finished: bool) -> int:
    """Tokens counted against the budget: the completion without its closing EOS."""
    return len(completion_ids) - (1 if finished else 0)


def length_penalty(length: int, budget: Budget | None) -> float:
    if budget is None:
        return 0.0
    return budget.penalty * abs(budget.target - length)


@dataclass(frozen=True)
class Score:
    task_reward: float
    length_penalty: float
    reward: float


def score_completion(env: Verifier, task, text: str, completion_ids: Sequence[int], finished: bool,  # noqa: ANN001
                     budget: Budget | None) -> Score:
    """Score one completion: the env's verifier on the decoded text, minus the budget's length penalty."""
    task_reward = float(env.verify(task, text))
    pen = length_penalty(completion_length(completion_ids, finished), budget)
    return Score(task_reward, pen, task_reward - pen)


class _Claim(Protocol):
    task_reward: float
    length_penalty: float
    reward: float
    finished: bool
    completion_ids: Sequence[int]


def check_score(row: _Claim, env: Verifier, task, text: str, eos_id: int | None,  # noqa: ANN001
                budget: Budget | None, tol: float) -> str | None:
    """The validator's re-check of a claimed score; returns what is wrong, or None when it holds.

    ``finished`` is re-derived from the tokens (ends with EOS) whenever a budget makes it count; a budget counts
    the model's tokens (``model_mask``: a multi-turn row's environment tokens are not the model's)."""
    ids = list(row.completion_ids)
    mask = getattr(row, "completion_mask", None)
    if mask is not None:
        ids = [t for t, m in zip(ids, mask) if m]
    finished = row.finished
    if budget is not None:
        ends = bool(ids) and ids[-1] == eos_id
        if row.finished != ends:
            return f"finished={row.finished} but the completion {'ends' if ends else 'does not end'} with EOS"
        finished = ends
    want = score_completion(env, task, text, ids, finished, budget)
    if abs(want.task_reward - row.task_reward) > tol:
        return f"task_reward {row.task_reward:g} but the verifier gives {want.task_reward:g}"
    if budget is None:
        if row.length_penalty != 0.0:
            return f"length_penalty {row.length_penalty:g} without a thinking budget"
    elif abs(want.length_penalty - row.length_penalty) > tol:
        return (f"length_penalty {row.length_penalty:g} but budget {budget.target} and "
                f"{completion_length(ids, finished)} tokens give {want.length_penalty:g}")
    if row.length_penalty < -tol or abs(row.reward - (row.task_reward - row.length_penalty)) > tol:
        return (f"reward {row.reward:g} != task_reward - length_penalty "
                f"({row.task_reward:g} - {row.length_penalty:g})")
    return None
