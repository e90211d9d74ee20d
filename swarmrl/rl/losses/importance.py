"""The off-policy correction's importance weight (``loss.correction``), the same for every loss.

``tis`` (truncated importance sampling) and ``mis`` (masked) take the decoupled form (AReaL's): the ratio is taken
against the trainer's own policy at the start of the update, pi_prox = ``logp.detach()``, and the sample is
re-weighted by w = pi_prox / pi_infer, per token or per sequence (``correction_level``; a sequence's w is the
product over its tokens): ``tis`` truncates it, w = min(w, cap); ``mis`` drops what leaves a band,
w = w if low <= w <= high else 0. w carries no gradient. ``none``: w = 1 and the ratio is pi_theta / pi_infer (a
stale sample's distance from the trainer is what the loss's clip bounds).

This trainer takes one optimizer step per batch, so under ``tis`` / ``mis`` the ratio against pi_prox is 1 and the
loss's clip never binds: the update keeps no trust region around the behaviour policy. Measured
(``benchmarks/rl/RESULTS.md``, "Losses"), that makes stale runs worse, not better; the corrections suit a mismatch
between engines (vLLM's logprobs against the trainer's), not staleness.
"""

from __future__ import annotations

import torch

from swarmrl.rl.losses.objective import Objective
from swarmrl.rl.losses.ratio import clamped, per_sequence


def importance_weight(obj: Objective, d: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """w = pi_prox / pi_infer (``d`` = logp_prox - old, masked), truncated or masked as ``obj.correction`` says;
    [B, T], no gradient. 1 everywhere without a correction."""
    if obj.correction == "none":
        return torch.ones_like(d)
    log_w = per_sequence(d, mask, mean=False).expand_as(d) if obj.correction_level == "sequence" else d
    w = torch.exp(clamped(log_w))
    if obj.correction == "tis":
        return torch.clamp(w, max=obj.tis_cap)
    lo, hi = obj.mis_band
    return torch.where((w >= lo) & (w <= hi), w, torch.zeros_like(w))
