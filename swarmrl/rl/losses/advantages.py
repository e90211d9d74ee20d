"""Group-relative advantages from a group's rewards: the one place they are computed. Each loss picks its rule
(``Loss.advantages``); the trainer applies it to every group it trains on. Rows carry rewards, never advantages.
Pure Python (no torch)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def group_advantages(rewards: Sequence[float], use_std: bool = True, eps: float = 1e-6,
                     leave_one_out: bool = False) -> list[float]:
    """(r - mean) / (std + eps) within one group; with ``use_std=False``: r - mean. With ``leave_one_out`` (RLOO)
    each sample's baseline is the mean of the others: r_i - mean_{j != i} r_j = G / (G - 1) (r_i - mean).

    std is the population standard deviation (a group of G samples is the whole population)."""
    r = [float(x) for x in rewards]
    if not r:
        return []
    mean = math.fsum(r) / len(r)
    centred = [x - mean for x in r]
    if leave_one_out and len(r) > 1:
        centred = [c * len(r) / (len(r) - 1) for c in centred]
    if use_std:
        std = math.sqrt(math.fsum(c * c for c in centred) / len(r))
        centred = [c / (std + eps) for c in centred]
    return centred
