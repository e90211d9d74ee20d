"""Group-relative advantages and online filtering of groups that carry no signal."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def group_advantages(rewards: Sequence[float], use_std: bool = True, eps: float = 1e-6) -> list[float]:
    """(r - mean) / (std + eps) within one group; with ``use_std=False``: r - mean.

    std is the population standard deviation (a group of G samples is the whole population).
    """
    r = torch.tensor(list(rewards), dtype=torch.float64)
    if r.numel() == 0:
        return []
    centred = r - r.mean()
    if use_std:
        centred = centred / (r.std(unbiased=False) + eps)
    return centred.tolist()


def is_informative(rewards: Sequence[float], tol: float = 1e-9) -> bool:
    """A group whose rewards all tie has zero advantages everywhere: no gradient signal."""
    return len(rewards) > 1 and (max(rewards) - min(rewards)) > tol
