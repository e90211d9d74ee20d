"""What a policy-gradient objective is made of, as plain data (no torch): which loss (``kind``, a registered name:
``swarmrl.rl.losses.registry``), its clips and its off-policy correction. ``LossConfig.objective()`` resolves one
from a run's config; ``swarmrl.rl.losses.policy.policy_loss`` computes it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Normalization = Literal["sequence", "token", "constant"]
Correction = Literal["none", "tis", "mis"]


@dataclass(frozen=True)
class Objective:
    """The resolved knobs of one loss (``LossConfig.objective()``)."""

    kind: str = "grpo"  # the name of a registered loss
    clip_low: float = 0.2
    clip_high: float = 0.2
    delta: float | None = 4.0
    correction: Correction = "none"
    correction_level: Literal["token", "sequence"] = "token"
    tis_cap: float = 2.0
    mis_band: tuple[float, float] = (0.5, 2.0)
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
