"""The statistics every loss reports (``rundir.LossStats``), per completion token: the shares its own clips
changed (``Loss.clip_counts``), the ratio, entropy, KL, the importance weight, and the mismatch between inference
and trainer, ``mismatch_kl``: the k3 estimate of KL(pi_infer || pi_train) over the sampled tokens,
exp(d) - 1 - d with d = logp - old (0 when both compute the same logprobs; on CPU in float32 it is ~1e-7)."""

from __future__ import annotations

import torch

from swarmrl.rl.losses.base import ClipCounts
from swarmrl.rl.losses.ratio import LOG_RATIO_CLAMP
from swarmrl.rundir.records import LossStats


def loss_stats(clips: ClipCounts, r: torch.Tensor, mask: torch.Tensor, d: torch.Tensor, w: torch.Tensor,
               entropy: torch.Tensor | None, kl_val: float) -> LossStats:
    """A micro-batch's statistics (``r`` the ratio, ``d`` trainer minus inference logprobs, ``w`` the importance
    weight; all [B, T], no gradient)."""
    n = mask.sum().clamp(min=1)
    low, high, dcap = clips
    dm = torch.clamp(d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    mismatch = (torch.exp(dm) - 1.0 - dm) * mask
    return LossStats(
        clip_frac=float(((low + high + dcap) > 0).sum() / n),
        clip_low_frac=float(low.sum() / n),
        clip_high_frac=float(high.sum() / n),
        delta_frac=float(dcap.sum() / n),
        ratio_mean=float((r * mask).sum() / n),
        ratio_max=float(torch.where(mask.bool(), r, torch.zeros_like(r)).max()) if mask.any() else 1.0,
        entropy=float((entropy.detach() * mask).sum() / n) if entropy is not None else 0.0,
        kl=kl_val,
        mismatch_kl=float(mismatch.sum() / n),
        is_weight_mean=float((w * mask).sum() / n),
        is_dropped_frac=float(((w == 0) * mask).sum() / n),
        tokens=int(mask.sum()),
    )
