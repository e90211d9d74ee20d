"""Rollout sequences as model input: what the trainer's update and the validator's logprob re-check both run.

``pack`` lays prompt+completion sequences out as right-padded tensors and ``sequence_logprobs`` runs the model
over them, so the logprobs the validator recomputes for a row are those the trainer's loss uses for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Sequence:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    advantage: float
    temperature: float


def pack(seqs: list[Sequence], pad_id: int) -> dict[str, torch.Tensor]:
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
