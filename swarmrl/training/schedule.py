"""The learning-rate schedule: one rule for every training loop.

The rate rises linearly over the first ``warmup`` steps (step s of them runs at ``(s + 1) / warmup`` of the base
rate, so the first step already moves) and then holds; with a ``total`` it decays instead, along half a cosine,
from the base rate at the end of the warm-up to ``min_ratio`` of it at step ``total`` and stays there. The RL
trainer and SFT hold (``optim.warmup_steps``, ``warmup_steps``); DiLoCo's inner steps decay (``warmup_steps``,
``total_steps``, ``min_lr_ratio``), as OpenDiLoCo does.
"""

from __future__ import annotations

import math

import torch


def lr_factor(step: int, warmup: int, total: int | None = None, min_ratio: float = 0.1) -> float:
    """The multiple of the base learning rate at optimizer step ``step`` (0-based): linear warm-up over ``warmup``
    steps, then 1.0 (no ``total``) or a cosine decay to ``min_ratio`` at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    if total is None or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(opt: torch.optim.Optimizer, warmup: int, total: int | None = None,
                    min_ratio: float = 0.1) -> torch.optim.lr_scheduler.LambdaLR:
    """``opt``'s schedule by ``lr_factor``. The factor is a plain function (a closure), so the scheduler's state
    dict holds only its counters, as a checkpoint of the trainer's state has always held."""
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, warmup, total, min_ratio))
