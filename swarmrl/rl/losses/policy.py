"""The policy loss over a micro-batch (pure math: tensors in, tensors out), the same steps for every loss; what
differs between losses (the ratio, the token objective, which clips count) comes from the registered loss
``obj.kind`` names (``swarmrl.rl.losses.registry``)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from swarmrl.rl.losses.importance import importance_weight
from swarmrl.rl.losses.objective import Objective
from swarmrl.rl.losses.ratio import clamped
from swarmrl.rl.losses.registry import get_loss
from swarmrl.rl.losses.stats import loss_stats
from swarmrl.rundir.records import LossStats


class TokenLoss(NamedTuple):
    loss: torch.Tensor  # the weighted sum over the batch's tokens (differentiable)
    stats: LossStats


def policy_loss(obj: Objective, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                weights: torch.Tensor, mask: torch.Tensor, entropy: torch.Tensor | None = None,
                ref_logp: torch.Tensor | None = None) -> TokenLoss:
    """The loss of ``obj.kind`` over a micro-batch. All tensors are [batch, tokens] (advantages may be [batch]);
    ``weights`` holds the normalisation (``swarmrl.rl.losses.weights``), ``mask`` is 1 on completion tokens.
    Returns the weighted SUM (summing over micro-batches gives the batch loss) and the statistics of this
    micro-batch.

    The ratio is taken against the inference logprobs ``old_logp``, or with an off-policy correction against the
    trainer's own (``swarmrl.rl.losses.importance``); every log-ratio is clamped before it is exponentiated. The
    entropy bonus and the KL penalty (k3 estimate of KL(pi || ref)) are added per token."""
    loss = get_loss(obj.kind)
    mask = mask.to(logp.dtype)
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logp)
    a = advantages
    d = (logp.detach() - old_logp) * mask  # trainer vs inference, per sampled token
    w = importance_weight(obj, d, mask)
    ref = old_logp if obj.correction == "none" else logp.detach()
    ratio = loss.ratio(clamped((logp - ref) * mask), mask)
    total = loss.token_objective(obj, ratio, a, logp) * w
    if entropy is not None and obj.entropy_coef:
        total = total - obj.entropy_coef * entropy
    kl_val = 0.0
    if ref_logp is not None and obj.kl_coef:
        # k3 estimator of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1  (>= 0, unbiased)
        dr = clamped(ref_logp - logp)
        kl_tok = torch.exp(dr) - dr - 1.0
        total = total + obj.kl_coef * kl_tok
        with torch.no_grad():
            kl_val = float((kl_tok * mask).sum() / mask.sum().clamp(min=1))
    out = (total * weights * mask).sum()
    with torch.no_grad():
        r, a = ratio.detach(), a.detach()
        return TokenLoss(out, loss_stats(loss.clip_counts(obj, r, a, mask), r, mask, d, w, entropy, kl_val))
