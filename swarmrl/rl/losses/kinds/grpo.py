"""``grpo``: the default loss."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from swarmrl.rl.losses.advantages import group_advantages
from swarmrl.rl.losses.base import ClipCounts, Loss, clipped_surrogate, surrogate_clips

if TYPE_CHECKING:
    from torch import Tensor

    from swarmrl.rl.losses.objective import Objective


class GRPO(Loss):
    """GRPO (Shao et al. 2024, "DeepSeekMath"), with INTELLECT-2's cap delta (Prime Intellect 2025):
    -min(min(r, delta) A, clip(r, 1 - eps_l, 1 + eps_h) A) per token, r = pi_theta / pi_old; advantages
    (r - mean) / std per group; token-level normalisation (the config's default)."""

    name = "grpo"
    defaults = {}

    def advantages(self, rewards: Sequence[float], use_std: bool) -> list[float]:
        return group_advantages(rewards, use_std=use_std)

    def token_objective(self, obj: Objective, ratio: Tensor, a: Tensor, logp: Tensor) -> Tensor:
        return clipped_surrogate(ratio, a, obj.clip_low, obj.clip_high, obj.delta)

    def clip_counts(self, obj: Objective, r: Tensor, a: Tensor, mask: Tensor) -> ClipCounts:
        return surrogate_clips(r, a, mask, obj.clip_low, obj.clip_high, obj.delta)


LOSS = GRPO()
