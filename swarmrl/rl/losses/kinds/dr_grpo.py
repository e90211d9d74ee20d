"""``dr_grpo``: GRPO without its length and difficulty biases."""

from __future__ import annotations

from swarmrl.rl.losses.kinds.grpo import GRPO


class DrGRPO(GRPO):
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective"): GRPO's token
    objective, advantages r - mean (no division by the group's std), and a constant normaliser (the sum over
    tokens / (sequences x max tokens)) instead of dividing by each sequence's length, which removes the length
    bias."""

    name = "dr_grpo"
    defaults = {"use_std": False, "normalization": "constant"}


LOSS = DrGRPO()
