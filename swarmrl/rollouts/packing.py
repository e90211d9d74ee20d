"""Rollout sequences as model input: what the trainer's update and the validator's logprob re-check both run.

``pack`` lays prompt+completion sequences out as right-padded tensors and ``sequence_logprobs`` runs the model
over them, so the logprobs the validator recomputes for a row are those the trainer's loss uses for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint


@dataclass
class Sequence:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    advantage: float
    temperature: float
    mask: list[int] | None = None  # per completion token: 1 the model's, 0 an environment's reply (None: all 1)

    def model_tokens(self) -> int:
        """Completion tokens the model sampled: what the loss, its normalisation and the checks count."""
        return len(self.completion_ids) if self.mask is None else sum(1 for m in self.mask if m)


def pack(seqs: list[Sequence], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded prompt+completion; completion token t sits at position len(prompt) + t. ``cmask`` is 1 where
    the next token is one the model sampled: an environment's tokens (mask 0) are context, never scored."""
    full = [s.prompt_ids + s.completion_ids for s in seqs]
    width = max(len(f) for f in full)
    n = len(seqs)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    cmask = torch.zeros((n, width - 1), dtype=torch.float32)
    old = torch.zeros((n, width - 1), dtype=torch.float32)
    for i, (s, f) in enumerate(zip(seqs, full)):
        ids[i, : len(f)] = torch.tensor(f)
        attn[i, : len(f)] = 1
        p, c = len(s.prompt_ids), len(s.completion_ids)
        # logits at position j predict token j+1: completion tokens are predicted at p-1 .. p+c-2
        cmask[i, p - 1: p - 1 + c] = 1.0 if s.mask is None else torch.tensor(s.mask, dtype=torch.float32)
        old[i, p - 1: p - 1 + c] = torch.tensor(s.logprobs, dtype=torch.float32) * cmask[i, p - 1: p - 1 + c]
    return {"ids": ids, "attn": attn, "cmask": cmask, "old": old}


CHUNK_TOKENS = 512  # completion positions whose vocabulary-wide logits exist at once (chunked path)


def sequence_logprobs(model, packed: dict[str, torch.Tensor], temperature: float, with_entropy: bool = False,
                      entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs [B, L-1] of each next token under ``model`` at ``temperature`` (and the entropy of each position's
    distribution with ``with_entropy``; differentiable only with ``entropy_grad``). Completion positions
    (``packed["cmask"]``) are exact; the others are 0 where the chunked path runs.

    The chunked path (any HF model whose LM head is a plain linear layer on the decoder's output): the decoder runs
    once, then the LM head, log-sum-exp and the gather run over the completion positions only, ``CHUNK_TOKENS`` at
    a time, each chunk recomputed in the backward pass (activation checkpointing), so no [B, L, vocabulary] tensor
    (logits, log-softmax, their gradients) is ever whole in memory. Other models (a sharded or scaled head) take
    the plain path: the full log-softmax. Both give the same values (within float32 rounding)."""
    head = _plain_head(model)
    if head is None:
        return _full_logprobs(model, packed, temperature, with_entropy)
    hidden = model.get_decoder()(input_ids=packed["ids"], attention_mask=packed["attn"]).last_hidden_state
    pos = packed["cmask"].bool()
    h = hidden[:, :-1][pos]  # [N, H]: the positions that predict a completion token
    target = packed["ids"][:, 1:][pos]
    logp, ent = head_logprobs(head, h, target, temperature, with_entropy, entropy_grad)
    zeros = torch.zeros(pos.shape, dtype=torch.float32, device=h.device)
    return zeros.masked_scatter(pos, logp), (zeros.masked_scatter(pos, ent) if ent is not None else None)


def head_logprobs(head: torch.nn.Linear, h: torch.Tensor, target: torch.Tensor, temperature: float,
                  with_entropy: bool = False, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs [N] of ``target`` [N] under ``head(h)`` [N, vocabulary] at ``temperature`` (and entropies with
    ``with_entropy``): ``CHUNK_TOKENS`` rows at a time, each chunk recomputed in the backward pass, so no
    [N, vocabulary] tensor is whole in memory."""
    inv_t = 1.0 / max(temperature, 1e-6)
    lps, ents = [], []
    for i in range(0, h.shape[0], CHUNK_TOKENS):
        hc, tc = h[i: i + CHUNK_TOKENS], target[i: i + CHUNK_TOKENS]
        if with_entropy and entropy_grad:
            lp, ent = checkpoint(_chunk, hc, tc, head.weight, head.bias, inv_t, True, use_reentrant=False)
        else:
            lp = checkpoint(_chunk, hc, tc, head.weight, head.bias, inv_t, False, use_reentrant=False)[0]
            ent = None
            if with_entropy:
                with torch.no_grad():
                    ent = _chunk(hc, tc, head.weight, head.bias, inv_t, True)[1]
        lps.append(lp)
        ents.append(ent)
    empty = h.new_zeros(0, dtype=torch.float32)
    logp = torch.cat(lps) if lps else empty
    return logp, ((torch.cat(ents) if ents else empty) if with_entropy else None)


def _chunk(h: torch.Tensor, target: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, inv_t: float,
           entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits = torch.nn.functional.linear(h, weight, bias).float() * inv_t
    lse = torch.logsumexp(logits, dim=-1)
    lp = logits.gather(-1, target[:, None])[:, 0] - lse
    if not entropy:
        return lp, None
    return lp, lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)


def _plain_head(model) -> torch.nn.Linear | None:  # noqa: ANN001
    """The LM head when logits are just ``head(decoder output)`` (no soft-capping or scaling, not sharded)."""
    get_head, get_decoder = getattr(model, "get_output_embeddings", None), getattr(model, "get_decoder", None)
    if get_head is None or get_decoder is None:
        return None
    head = get_head()
    cfg = getattr(model, "config", None)
    scaled = any(getattr(cfg, k, None) not in (None, 1.0) for k in ("final_logit_softcapping", "logit_scale",
                                                                    "logits_scaling"))
    if type(head) is not torch.nn.Linear or scaled or type(head.weight) is not torch.nn.Parameter:
        return None  # (a DTensor weight: FSDP2 gathers the head only inside the root module's forward)
    return head


def _full_logprobs(model, packed: dict[str, torch.Tensor], temperature: float, with_entropy: bool):  # noqa: ANN001
    out = model(input_ids=packed["ids"], attention_mask=packed["attn"])
    logits = out.logits[:, :-1, :].float() / max(temperature, 1e-6)
    logp_all = torch.log_softmax(logits, dim=-1)
    target = packed["ids"][:, 1:]
    logp = logp_all.gather(-1, target[..., None]).squeeze(-1)
    ent = None
    if with_entropy:
        ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp, ent
