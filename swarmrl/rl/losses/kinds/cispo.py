"""``cispo``: a clipped importance weight that keeps every token's gradient."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from swarmrl.rl.losses.advantages import group_advantages
from swarmrl.rl.losses.base import ClipCounts, Loss

if TYPE_CHECKING:
    from torch import Tensor

    from swarmrl.rl.losses.objective import Objective


class CISPO(Loss):
    """CISPO (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention"):
    -sg(min(r, 1 + eps_h)) A logp per token: the importance weight is clipped and carries no gradient, so every
    token keeps its gradient (no token is dropped by the clip); advantages as GRPO's."""

    name = "cispo"
    defaults = {"clip_eps_high": 0.28}

    def advantages(self, rewards: Sequence[float], use_std: bool) -> list[float]:
        return group_advantages(rewards, use_std=use_std)

    def token_objective(self, obj: Objective, ratio: Tensor, a: Tensor, logp: Tensor) -> Tensor:
        return -ratio.detach().clamp(max=1.0 + obj.clip_high) * a * logp

    def clip_counts(self, obj: Objective, r: Tensor, a: Tensor, mask: Tensor) -> ClipCounts:
        # the weight is clipped, the gradient kept: only the upper clip is counted, as applied
        zero = mask.new_zeros(mask.shape)
        return ClipCounts(zero, (r > 1.0 + obj.clip_high) * mask, zero)


LOSS = CISPO()
