"""``gspo``: the sequence-level ratio."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from swarmrl.rl.losses.advantages import group_advantages
from swarmrl.rl.losses.base import ClipCounts, Loss, clipped_surrogate, surrogate_clips
from swarmrl.rl.losses.ratio import clamped, per_sequence

if TYPE_CHECKING:
    from torch import Tensor

    from swarmrl.rl.losses.objective import Objective


class GSPO(Loss):
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): a sequence-level ratio
    s_i = exp(mean_t (logp - old)), clipped per sequence (eps 3e-4 / 4e-4, no cap delta):
    -min(s_i A_i, clip(s_i, 1 - eps_l, 1 + eps_h) A_i), spread over the sequence's tokens with sequence-level
    normalisation; advantages as GRPO's."""

    name = "gspo"
    defaults = {"clip_eps": 3e-4, "clip_eps_high": 4e-4, "normalization": "sequence"}

    def advantages(self, rewards: Sequence[float], use_std: bool) -> list[float]:
        return group_advantages(rewards, use_std=use_std)

    def ratio(self, log_ratio: Tensor, mask: Tensor) -> Tensor:
        return clamped(per_sequence(log_ratio, mask, mean=True)).exp().expand_as(log_ratio)

    def token_objective(self, obj: Objective, ratio: Tensor, a: Tensor, logp: Tensor) -> Tensor:
        return clipped_surrogate(ratio, a, obj.clip_low, obj.clip_high, None)

    def clip_counts(self, obj: Objective, r: Tensor, a: Tensor, mask: Tensor) -> ClipCounts:
        return surrogate_clips(r, a, mask, obj.clip_low, obj.clip_high, None)


LOSS = GSPO()
