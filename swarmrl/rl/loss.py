"""Token-level GRPO loss with two-sided ratio clipping (pure math: tensors in, tensors out).

For every completion token t with advantage A (shared by the tokens of a sequence), current
logprob ``logp`` and behaviour (inference) logprob ``old``:

    ratio = exp(logp - old)
    loss_t = -min(min(ratio, delta) * A, clip(ratio, 1 - eps, 1 + eps) * A)

PPO's ``min`` already bounds the ratio for A > 0; for A < 0 it picks the larger ratio term and is
unbounded, so the extra upper bound ``delta`` (INTELLECT-2: 4) caps it. Token losses are combined
with per-token weights that encode the normalisation, computed over the WHOLE batch (so
micro-batching and data-parallel ranks give the same gradient as one big batch):

- ``sequence``: mean over a sequence's tokens, then mean over sequences;
- ``token``: mean over all tokens of the batch;
- ``constant``: sum over all tokens divided by a constant (num_sequences * max_tokens by default).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

from swarmrl.rundir.records import LossStats

Normalization = Literal["sequence", "token", "constant"]


class TokenLoss(NamedTuple):
    loss: torch.Tensor  # the weighted sum over the batch's tokens (differentiable)
    stats: LossStats


def token_weights(lengths: list[int], normalization: Normalization, constant: float | None = None,
                  total_sequences: int | None = None, total_tokens: int | None = None,
                  max_tokens: int | None = None) -> list[torch.Tensor]:
    """Per-token weights for sequences of the given lengths.

    ``total_sequences``/``total_tokens`` describe the GLOBAL batch (defaults: these sequences).
    """
    n_seq = total_sequences if total_sequences is not None else len(lengths)
    n_tok = total_tokens if total_tokens is not None else sum(lengths)
    out = []
    for n in lengths:
        if normalization == "sequence":
            w = 1.0 / (n_seq * max(n, 1))
        elif normalization == "token":
            w = 1.0 / max(n_tok, 1)
        elif normalization == "constant":
            c = constant if constant is not None else n_seq * (max_tokens or max(lengths))
            w = 1.0 / c
        else:
            raise ValueError(f"unknown normalization {normalization!r}")
        out.append(torch.full((n,), w, dtype=torch.float32))
    return out


def grpo_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, weights: torch.Tensor,
                    mask: torch.Tensor, clip_eps: float = 0.2, delta: float | None = 4.0,
                    entropy: torch.Tensor | None = None, entropy_coef: float = 0.0,
                    ref_logp: torch.Tensor | None = None, kl_coef: float = 0.0) -> TokenLoss:
    """All tensors are [batch, tokens] (advantages may be [batch] or [batch, tokens]).

    ``weights`` already holds the normalisation; ``mask`` is 1 for completion tokens.
    Returns the weighted SUM (so summing over micro-batches gives the batch loss).
    """
    mask = mask.to(logp.dtype)
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logp)
    log_ratio = (logp - old_logp) * mask
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    capped = torch.clamp(ratio, max=delta) * advantages if delta is not None else unclipped
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    per_token = -torch.minimum(capped, clipped)
    total = per_token
    ent_val = 0.0
    if entropy is not None and entropy_coef:
        total = total - entropy_coef * entropy
    kl_val = 0.0
    if ref_logp is not None and kl_coef:
        # k3 estimator of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1  (>= 0, unbiased)
        d = ref_logp - logp
        kl_tok = torch.exp(d) - d - 1.0
        total = total + kl_coef * kl_tok
        with torch.no_grad():
            kl_val = float((kl_tok * mask).sum() / mask.sum().clamp(min=1))
    loss = (total * weights * mask).sum()
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        r = ratio.detach()
        a = advantages.detach()
        low = ((r < 1.0 - clip_eps) & (a < 0)) * mask  # clipped term chosen, gradient zero
        high = ((r > 1.0 + clip_eps) & (a > 0)) * mask
        dcap = ((r > delta) & (a < 0)) * mask if delta is not None else torch.zeros_like(mask)
        if entropy is not None:
            ent_val = float((entropy.detach() * mask).sum() / n)
        masked_r = torch.where(mask.bool(), r, torch.zeros_like(r))
        return TokenLoss(loss, LossStats(
            clip_frac=float(((low + high + dcap) > 0).sum() / n),
            clip_low_frac=float(low.sum() / n),
            clip_high_frac=float(high.sum() / n),
            delta_frac=float(dcap.sum() / n),
            ratio_mean=float((r * mask).sum() / n),
            ratio_max=float(masked_r.max()) if mask.any() else 1.0,
            entropy=ent_val,
            kl=kl_val,
            tokens=int(mask.sum()),
        ))
