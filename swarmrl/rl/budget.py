"""Thinking-budget settings of a run (``rl.budget``). The rules themselves (how a budget is stated in the
prompt and scored, which targets a worker of some speed gets) live in ``swarmrl.contract``."""

from __future__ import annotations

from pydantic import Field, field_validator

from swarmrl.config import StrictModel
from swarmrl.contract import Budget, check_prompt_format


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

    def budget(self, target: int | None) -> Budget | None:
        """The budget of one group with this target (None: no budget)."""
        return None if target is None else Budget(target, self.penalty, self.prompt_format)
