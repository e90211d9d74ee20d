"""``rloo``: the leave-one-out baseline."""

from __future__ import annotations

from collections.abc import Sequence

from swarmrl.rl.losses.advantages import group_advantages
from swarmrl.rl.losses.kinds.grpo import GRPO


class RLOO(GRPO):
    """RLOO (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from
    Human Feedback in LLMs"): the leave-one-out baseline, A_i = r_i - mean_{j != i} r_j, with GRPO's clipped
    token objective."""

    name = "rloo"
    defaults = {"use_std": False}

    def advantages(self, rewards: Sequence[float], use_std: bool) -> list[float]:
        return group_advantages(rewards, use_std=use_std, leave_one_out=True)


LOSS = RLOO()
