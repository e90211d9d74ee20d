"""Which step still needs work: the one rule the local worker and the orchestrator both follow.

A holder of policy version ``v`` may generate for the steps ``AsyncWindow.steps_for_version`` gives (from the
trainer's current step to ``v + async_level``, never past the last step, and for the orchestrator at most
``lookahead`` ahead). Of those, work goes to the lowest step whose expected usable groups are short of what the
trainer takes per step (times ``overassign``, the orchestrator's head-room for work that comes back unusable or
late). What "expected usable groups" counts is each caller's own bookkeeping: the local worker counts the groups
rollout files announce minus those the trainer found unusable (``RunDir.informative_groups``); the orchestrator
counts pending and accepted submissions plus open assignments at the share recent uploads made usable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from swarmrl.contract.window import AsyncWindow


@dataclass(frozen=True)
class Demand:
    groups_per_step: int  # usable groups the trainer uses per step (rl.prompts_per_step)
    overassign: float = 1.0  # work handed out up to this multiple of the need

    @property
    def need(self) -> float:
        return self.groups_per_step * self.overassign

    def step_in_need(self, window: AsyncWindow, version: int, current_step: int,
                     expected: Callable[[int], float], lookahead: int | None = None) -> int | None:
        """The lowest step ``version`` may serve whose ``expected(step)`` usable groups fall short; None when
        every such step has enough (or the version serves none)."""
        for step in window.steps_for_version(version, current_step, lookahead):
            if expected(step) < self.need:
                return step
        return None
