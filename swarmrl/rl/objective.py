"""What a policy-gradient objective is made of, as plain data (no torch): its kind, clips and off-policy correction.
``swarmrl.rl.loss`` computes it; ``LossConfig.objective()`` resolves one from a run's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Normalization = Literal["sequence", "token", "constant"]
LossKind = Literal["grpo", "dr_grpo", "dapo", "gspo", "cispo", "rloo"]
Correction = Literal["none", "tis", "mis"]


@dataclass(frozen=True)
class Objective:
    """The resolved knobs of one loss (``LossConfig.objective()``)."""

    kind: LossKind = "grpo"
    clip_low: float = 0.2
    clip_high: float = 0.2
    delta: float | None = 4.0
    correction: Correction = "none"
    correction_level: Literal["token", "sequence"] = "token"
    tis_cap: float = 2.0
    mis_band: tuple[float, float] = (0.5, 2.0)
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
