"""Thinking budgets: a target length stated in the prompt and a reward that penalises missing it.

reward = task_reward - lambda * |T - length|   (length = completion tokens, EOS excluded)

A worker's budgets can be matched to its measured throughput: slow workers only get targets
they can finish within a batch-time cap.
"""

from __future__ import annotations

import random

from pydantic import Field, field_validator

from swarmrl.config import StrictModel


class BudgetConfig(StrictModel):
    enabled: bool = False
    targets: list[int] = Field(default_factory=lambda: [4, 8, 12])
    penalty: float = Field(0.02, ge=0)  # lambda per token of distance
    prompt_format: str = "[{target}]{prompt}"
    match_throughput: bool = False
    max_batch_seconds: float = Field(10.0, gt=0)  # with match_throughput: a batch must fit this time

    @field_validator("prompt_format")
    @classmethod
    def _fmt(cls, v: str) -> str:
        return check_prompt_format(v)


def check_prompt_format(fmt: str) -> str:
    """A budget prompt format must use exactly the fields {target} and {prompt} (and may not do anything else)."""
    import string

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


def format_prompt(prompt: str, target: int | None, cfg: BudgetConfig | str) -> str:
    """The prompt as the model sees it under a thinking budget (``cfg``: a BudgetConfig or its prompt format)."""
    if target is None:
        return prompt
    fmt = cfg if isinstance(cfg, str) else cfg.prompt_format
    return fmt.format(target=target, prompt=prompt)


def completion_length(completion_ids: list[int], finished: bool) -> int:
    """Tokens counted against the budget: the completion without its closing EOS."""
    return len(completion_ids) - (1 if finished else 0)


def length_penalty(length: int, target: int | None, penalty: float) -> float:
    if target is None:
        return 0.0
    return penalty * abs(target - length)


def allowed_targets(cfg: BudgetConfig, tokens_per_s: float | None, sequences_per_batch: int) -> list[int]:
    """Targets a worker of the given throughput may get (always at least the shortest one)."""
    targets = sorted(set(cfg.targets))
    if not targets:
        raise ValueError("budget.targets is empty")
    if not cfg.match_throughput or not tokens_per_s:
        return targets
    cap = tokens_per_s * cfg.max_batch_seconds / max(1, sequences_per_batch)
    fit = [t for t in targets if t <= cap]
    return fit or targets[:1]


def draw_targets(n: int, targets: list[int], rng: random.Random) -> list[int]:
    return [rng.choice(targets) for _ in range(n)]
