"""Log-ratios made safe to exponentiate, and per-sequence sums: the pieces every loss's ratio is built from.

Every log-ratio is clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] before it is exponentiated, so no input makes an
infinity or a NaN. Written with tensor methods only, so the loss modules that use it import without torch (the
config validates a loss's name and reads its defaults, and ``swarmrl run --print-config`` loads no torch)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 4.9e8: far beyond any clip or cap, far below float32's range


def clamped(log_ratio: Tensor) -> Tensor:
    """``log_ratio`` clamped to +-LOG_RATIO_CLAMP."""
    return log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def per_sequence(x: Tensor, mask: Tensor, mean: bool) -> Tensor:
    """Sum (or mean) of ``x`` over each sequence's tokens, as [B, 1]."""
    s = (x * mask).sum(-1, keepdim=True)
    return s / mask.sum(-1, keepdim=True).clamp(min=1) if mean else s
