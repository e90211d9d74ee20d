"""The policy-gradient objectives (pure math: tensors in, tensors out): one family, picked by ``loss.kind``.

Notation, per completion token t of sequence i: ``logp`` the trainer's logprob (differentiable), ``old`` the
inference (behaviour) logprob the worker recorded, A_i the sequence's advantage, |y_i| its length.

Off-policy correction (``loss.correction``) decides what the ratio is taken against:

- ``none``: the ratio is pi_theta / pi_infer, ``ratio = exp(logp - old)``, clipped as the kind says (a stale
  sample's distance from the trainer is what the clip bounds);
- ``tis`` (truncated importance sampling) and ``mis`` (masked): the decoupled form (AReaL's): the ratio is taken
  against the trainer's own policy at the start of the update, pi_prox = ``logp.detach()``, and the sample is
  re-weighted by w = pi_prox / pi_infer, per token or per sequence (``correction_level``; a sequence's w is the
  product over its tokens): ``tis`` truncates it, w = min(w, cap); ``mis`` drops what leaves a band,
  w = w if low <= w <= high else 0. w carries no gradient. This trainer takes one optimizer step per batch, so the
  ratio against pi_prox is 1 and the kind's clip never binds: the update keeps no trust region around the
  behaviour policy. Measured (``benchmarks/rl/RESULTS.md``, "Losses"), that makes stale runs worse, not better;
  the corrections suit a mismatch between engines (vLLM's logprobs against the trainer's), not staleness.

Every log-ratio is clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] before it is exponentiated, so no input makes an
infinity or a NaN. The mismatch between inference and trainer is reported either way: ``mismatch_kl``, the k3
estimate of KL(pi_infer || pi_train) over the sampled tokens, exp(d) - 1 - d with d = logp - old (0 when both
compute the same logprobs; on CPU in float32 it is ~1e-7).

The kinds (token objective before the IS weight; r the ratio above, eps_l / eps_h the lower / upper clip):

- ``grpo`` (DeepSeekMath, with INTELLECT-2's cap delta): -min(min(r, delta) A, clip(r, 1 - eps_l, 1 + eps_h) A);
  advantages (r - mean) / std per group; token-level normalisation. The default.
- ``dr_grpo`` (Liu et al. 2025, "Understanding R1-Zero-Like Training"): the same token objective, advantages
  r - mean (no std), and a constant normaliser (sum over tokens / (sequences x max tokens)) instead of dividing by
  each sequence's length, which removes the length bias.
- ``dapo`` (Yu et al. 2025, DAPO): clip-higher (eps_h = 0.28 > eps_l = 0.2), token-level normalisation, and
  overlong filtering (a completion cut at ``max_new_tokens`` without EOS is left out of the loss); dynamic
  sampling is the run's tie filter (``contract.filter_ties``).
- ``gspo`` (Zheng et al. 2025, GSPO): a sequence-level ratio s_i = exp(mean_t (logp - ref)), clipped per
  sequence (eps 3e-4 / 4e-4): -min(s_i A_i, clip(s_i, 1 - eps_l, 1 + eps_h) A_i), spread over the sequence's
  tokens with sequence-level normalisation.
- ``cispo`` (MiniMax-M1, 2025): -sg(min(r, 1 + eps_h)) A logp: the importance weight is clipped and carries no
  gradient, so every token keeps its gradient (no token is dropped by the clip).
- ``rloo`` (Ahmadian et al. 2024, "Back to Basics"): the leave-one-out baseline, A_i = r_i - mean_{j != i} r_j,
  with the clipped token objective of ``grpo``.

Token losses are combined with per-token weights that encode the normalisation, computed over the WHOLE batch
(so micro-batching and data-parallel ranks give the same gradient as one big batch):

- ``sequence``: mean over a sequence's tokens, then mean over sequences;
- ``token``: mean over all tokens of the batch;
- ``constant``: sum over all tokens divided by a constant (num_sequences * max_tokens by default).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from swarmrl.rl.objective import Normalization, Objective
from swarmrl.rundir.records import LossStats

LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 4.9e8: far beyond any clip or cap, far below float32's range


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


def _clamped(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _per_sequence(x: torch.Tensor, mask: torch.Tensor, mean: bool) -> torch.Tensor:
    """Sum (or mean) of ``x`` over each sequence's tokens, as [B, 1]."""
    s = (x * mask).sum(-1, keepdim=True)
    return s / mask.sum(-1, keepdim=True).clamp(min=1) if mean else s


def importance_weight(obj: Objective, d: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """w = pi_prox / pi_infer (``d`` = logp_prox - old, masked), truncated or masked as ``obj.correction`` says;
    [B, T], no gradient. 1 everywhere without a correction."""
    if obj.correction == "none":
        return torch.ones_like(d)
    log_w = _per_sequence(d, mask, mean=False).expand_as(d) if obj.correction_level == "sequence" else d
    w = torch.exp(_clamped(log_w))
    if obj.correction == "tis":
        return torch.clamp(w, max=obj.tis_cap)
    lo, hi = obj.mis_band
    return torch.where((w >= lo) & (w <= hi), w, torch.zeros_like(w))


def policy_loss(obj: Objective, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                weights: torch.Tensor, mask: torch.Tensor, entropy: torch.Tensor | None = None,
                ref_logp: torch.Tensor | None = None) -> TokenLoss:
    """The loss of ``obj.kind`` over a micro-batch. All tensors are [batch, tokens] (advantages may be [batch]);
    ``weights`` holds the normalisation, ``mask`` is 1 on completion tokens. Returns the weighted SUM (summing over
    micro-batches gives the batch loss) and the statistics of this micro-batch."""
    mask = mask.to(logp.dtype)
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logp)
    a = advantages
    d = (logp.detach() - old_logp) * mask  # trainer vs inference, per sampled token
    w = importance_weight(obj, d, mask)
    ref = old_logp if obj.correction == "none" else logp.detach()
    log_ratio = _clamped((logp - ref) * mask)
    if obj.kind == "gspo":
        ratio = torch.exp(_clamped(_per_sequence(log_ratio, mask, mean=True))).expand_as(logp)
    else:
        ratio = torch.exp(log_ratio)
    if obj.kind == "cispo":
        per_token = -torch.clamp(ratio.detach(), max=1.0 + obj.clip_high) * a * logp
    else:
        unclipped = ratio * a
        capped = torch.clamp(ratio, max=obj.delta) * a if obj.delta is not None and obj.kind != "gspo" else unclipped
        clipped = torch.clamp(ratio, 1.0 - obj.clip_low, 1.0 + obj.clip_high) * a
        per_token = -torch.minimum(capped, clipped)
    total = per_token * w
    if entropy is not None and obj.entropy_coef:
        total = total - obj.entropy_coef * entropy
    kl_val = 0.0
    if ref_logp is not None and obj.kl_coef:
        # k3 estimator of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1  (>= 0, unbiased)
        dr = _clamped(ref_logp - logp)
        kl_tok = torch.exp(dr) - dr - 1.0
        total = total + obj.kl_coef * kl_tok
        with torch.no_grad():
            kl_val = float((kl_tok * mask).sum() / mask.sum().clamp(min=1))
    loss = (total * weights * mask).sum()
    with torch.no_grad():
        return TokenLoss(loss, _stats(obj, ratio.detach(), a.detach(), mask, d, w, entropy, kl_val))


def _stats(obj: Objective, r: torch.Tensor, a: torch.Tensor, mask: torch.Tensor, d: torch.Tensor, w: torch.Tensor,
           entropy: torch.Tensor | None, kl_val: float) -> LossStats:
    n = mask.sum().clamp(min=1)
    low = ((r < 1.0 - obj.clip_low) & (a < 0)) * mask  # the clipped term chosen: gradient zero
    high = ((r > 1.0 + obj.clip_high) & (a > 0)) * mask
    if obj.kind == "cispo":  # the weight is clipped, the gradient kept: only the upper clip is counted, as applied
        low, high = torch.zeros_like(mask), (r > 1.0 + obj.clip_high) * mask
    dcap = ((r > obj.delta) & (a < 0)) * mask if obj.delta is not None and obj.kind not in ("gspo", "cispo") \
        else torch.zeros_like(mask)
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


def grpo_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, weights: torch.Tensor,
                    mask: torch.Tensor, clip_eps: float = 0.2, delta: float | None = 4.0,
                    entropy: torch.Tensor | None = None, entropy_coef: float = 0.0,
                    ref_logp: torch.Tensor | None = None, kl_coef: float = 0.0) -> TokenLoss:
    """``grpo`` without a correction (the default objective), with its knobs as arguments."""
    obj = Objective(clip_low=clip_eps, clip_high=clip_eps, delta=delta, entropy_coef=entropy_coef, kl_coef=kl_coef)
    return policy_loss(obj, logp, old_logp, advantages, weights, mask, entropy=entropy, ref_logp=ref_logp)
