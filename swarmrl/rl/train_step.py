"""One GRPO update on a batch of rollout sequences, shared by single-process, DDP and FSDP2 trainers.

Normalisation weights are computed from the GLOBAL batch, and each rank's loss is scaled by
``world_size`` when the gradient reduction averages over ranks (FSDP2; the trainer's "ddp" mode sums, so it
passes 1), so 2 ranks produce the same update as 1 rank. Under FSDP2 every rank must run the same number of
forward/backward passes (each one all-gathers parameters and reduce-scatters gradients): ``micro_batches``
pads a rank's share with passes that add exactly zero to every gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from swarmrl.rl.config import LossConfig
from swarmrl.rl.loss import grpo_token_loss, token_weights
from swarmrl.rundir.records import LossStats


@dataclass
class Sequence:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    advantage: float
    temperature: float


def _pack(seqs: list[Sequence], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded prompt+completion; completion token t sits at position len(prompt) + t."""
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
        cmask[i, p - 1: p - 1 + c] = 1.0
        old[i, p - 1: p - 1 + c] = torch.tensor(s.logprobs, dtype=torch.float32)
    return {"ids": ids, "attn": attn, "cmask": cmask, "old": old}


def sequence_logprobs(model, packed: dict[str, torch.Tensor], temperature: float, with_entropy: bool = False):
    out = model(input_ids=packed["ids"], attention_mask=packed["attn"])
    logits = out.logits[:, :-1, :].float() / max(temperature, 1e-6)
    logp_all = torch.log_softmax(logits, dim=-1)
    target = packed["ids"][:, 1:]
    logp = logp_all.gather(-1, target[..., None]).squeeze(-1)
    ent = None
    if with_entropy:
        ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp, ent


def _null_pass(model, pad_id: int) -> None:
    """A forward/backward pass that adds exactly zero to every gradient (a rank's share of passes is padded)."""
    ids = torch.full((1, 2), pad_id, dtype=torch.long)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    (out.logits.float().sum() * 0.0).backward()


@dataclass
class StepStats:
    loss: float  # this rank's share of the batch loss
    stats: LossStats  # over this rank's tokens


def accumulate_gradients(model, seqs: list[Sequence], loss_cfg: LossConfig, pad_id: int, micro_batch: int,
                         max_tokens: int, world_size: int = 1, total_sequences: int | None = None,
                         total_tokens: int | None = None, ref_model=None, micro_batches: int | None = None) -> StepStats:
    """Backward over ``seqs`` (this rank's share) in at least ``micro_batches`` passes; returns stats for this share."""
    lengths = [len(s.completion_ids) for s in seqs]
    weights_all = token_weights(lengths, loss_cfg.normalization, loss_cfg.constant,
                                total_sequences=total_sequences, total_tokens=total_tokens, max_tokens=max_tokens)
    loss_sum, parts = 0.0, []
    passes = max(math.ceil(len(seqs) / micro_batch), micro_batches or 0)
    for start in range(0, passes * micro_batch, micro_batch):
        mb = seqs[start: start + micro_batch]
        if not mb:
            _null_pass(model, pad_id)
            continue
        packed = _pack(mb, pad_id)
        temps = {s.temperature for s in mb}
        if len(temps) != 1:
            raise ValueError("a micro-batch mixes sampling temperatures")
        temp = temps.pop() or 1.0
        logp, ent = sequence_logprobs(model, packed, temp, with_entropy=True)
        w = torch.zeros_like(packed["old"])
        for i, s in enumerate(mb):
            p = len(s.prompt_ids)
            w[i, p - 1: p - 1 + len(s.completion_ids)] = weights_all[start + i]
        adv = torch.tensor([s.advantage for s in mb], dtype=torch.float32)
        ref = None
        if ref_model is not None and loss_cfg.kl_coef:
            with torch.no_grad():
                ref, _ = sequence_logprobs(ref_model, packed, temp)
        st = grpo_token_loss(logp, packed["old"], adv, w, packed["cmask"], clip_eps=loss_cfg.clip_eps,
                             delta=loss_cfg.delta, entropy=ent, entropy_coef=loss_cfg.entropy_coef,
                             ref_logp=ref, kl_coef=loss_cfg.kl_coef)
        (st.loss * world_size).backward()
        loss_sum += float(st.loss.detach())
        parts.append(st.stats)
    return StepStats(loss_sum, LossStats.combine(parts))
