"""What a loss is (``Loss``), and the clipped surrogate most of the family shares.

A loss is one small object in its own module of ``swarmrl.rl.losses.kinds``: its name (the value of
``rl.loss.kind``), the config knobs it sets when a run leaves them unset, its advantage rule, the ratio it clips
(per token, or per sequence), its token objective and which clips its statistics count. ``policy_loss`` does the
rest, the same for every loss: masking, the off-policy correction's importance weight, the entropy bonus, the KL
penalty, the normalisation weights and the common statistics.

Written with tensor methods only (torch is imported for type checking alone), so the registry, and with it the
config, loads no torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

if TYPE_CHECKING:
    from torch import Tensor

    from swarmrl.rl.losses.objective import Objective


class ClipCounts(NamedTuple):
    """Per token (masked, [B, T]), 1 where a clip changed the gradient: the lower clip, the upper clip, the cap
    delta. The statistics report their shares (``clip_low_frac``, ``clip_high_frac``, ``delta_frac``)."""

    low: Tensor
    high: Tensor
    delta: Tensor


class Loss(ABC):
    """One policy-gradient loss. A subclass's docstring names its source and its formula.

    Notation, per completion token t of sequence i: ``logp`` the trainer's logprob (differentiable), r the ratio
    (``ratio``), A_i the sequence's advantage, eps_l / eps_h the lower / upper clip (``Objective.clip_low`` /
    ``clip_high``)."""

    name: ClassVar[str]  # the value of ``rl.loss.kind``: the name of the module that defines the loss
    defaults: ClassVar[Mapping[str, Any]] = {}  # LossConfig fields set when the config leaves them unset

    @abstractmethod
    def advantages(self, rewards: Sequence[float], use_std: bool) -> list[float]:
        """A group's advantages from its rewards (``use_std``: the config's ``loss.use_std``)."""

    def ratio(self, log_ratio: Tensor, mask: Tensor) -> Tensor:
        """The ratio the objective clips, [B, T], from the clamped, masked per-token log-ratio: per token."""
        return log_ratio.exp()

    @abstractmethod
    def token_objective(self, obj: Objective, ratio: Tensor, a: Tensor, logp: Tensor) -> Tensor:
        """Each token's loss, [B, T], before the importance weight, the entropy bonus, the KL and the weights."""

    @abstractmethod
    def clip_counts(self, obj: Objective, r: Tensor, a: Tensor, mask: Tensor) -> ClipCounts:
        """Where this loss's clips changed the gradient (``r``, ``a``: the ratio and advantages, detached)."""


def clipped_surrogate(ratio: Tensor, a: Tensor, clip_low: float, clip_high: float, delta: float | None) -> Tensor:
    """PPO's clipped surrogate with an upper bound delta on the ratio (INTELLECT-2):
    -min(min(r, delta) A, clip(r, 1 - eps_l, 1 + eps_h) A); ``delta`` None: the plain PPO clip."""
    unclipped = ratio * a
    capped = ratio.clamp(max=delta) * a if delta is not None else unclipped
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * a
    return -capped.minimum(clipped)


def surrogate_clips(r: Tensor, a: Tensor, mask: Tensor, clip_low: float, clip_high: float,
                    delta: float | None) -> ClipCounts:
    """Where ``clipped_surrogate`` took a clipped term (its gradient is zero there): below 1 - eps_l with A < 0,
    above 1 + eps_h with A > 0, above delta with A < 0."""
    low = ((r < 1.0 - clip_low) & (a < 0)) * mask
    high = ((r > 1.0 + clip_high) & (a > 0)) * mask
    capped = ((r > delta) & (a < 0)) * mask if delta is not None else mask.new_zeros(mask.shape)
    return ClipCounts(low, high, capped)
