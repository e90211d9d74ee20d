"""One GRPO update on a batch of rollout sequences, shared by single-process, DDP and FSDP2 trainers.

Normalisation weights are computed from the WHOLE batch (``WholeBatch``: every rank's share), and each rank's
loss is scaled by ``Passes.loss_scale`` when the gradient reduction averages over ranks (FSDP2: the world size; the
trainer's "ddp" mode sums, so 1), so 2 ranks produce the same update as 1 rank. Under FSDP2 every rank must run the
same number of forward/backward passes (each one all-gathers parameters and reduce-scatters gradients):
``Passes.at_least`` pads a rank's share with passes that add exactly zero to every gradient. The KL reference is a frozen model or,
for a LoRA policy, ``rl.lora.BaseReference`` (the policy's own modules with the adapter switched off).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from swarmrl.rl.config import LossConfig
from swarmrl.rl.lora import BaseReference
from swarmrl.rl.losses.policy import policy_loss
from swarmrl.rl.losses.weights import token_weights
from swarmrl.rollouts.packing import Sequence, pack, sequence_logprobs
from swarmrl.rollouts.shared import pack_shared, shared_logprobs, supports_shared
from swarmrl.rundir.records import LossStats


def _null_pass(model, pad_id: int, ref_model=None) -> None:
    """A forward/backward pass that adds exactly zero to every gradient (a rank's share of passes is padded); the
    reference model, when one is used, runs its forward pass too (sharded, it all-gathers as the others do)."""
    ids = torch.full((1, 2), pad_id, dtype=torch.long)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    if ref_model is not None:  # in the order of a real pass (policy forward, reference forward, backward): a
        with torch.no_grad(), _reference(ref_model) as ref:  # sharded pair's collectives must come in that order
            ref(input_ids=ids, attention_mask=torch.ones_like(ids))
    (out.logits.float().sum() * 0.0).backward()


def _reference(ref_model: torch.nn.Module | BaseReference) -> contextlib.AbstractContextManager[torch.nn.Module]:
    """The KL reference as a module: a frozen copy as it is, or a LoRA policy's base with the adapter off."""
    return ref_model.disabled() if isinstance(ref_model, BaseReference) else contextlib.nullcontext(ref_model)


@dataclass(frozen=True)
class WholeBatch:
    """What the loss's normalisation needs of the whole batch (every rank's share): the row token limit (the
    ``constant`` normaliser's default), and its sequences and model tokens (None: this rank's share is the batch)."""

    max_tokens: int
    sequences: int | None = None
    tokens: int | None = None


@dataclass(frozen=True)
class Passes:
    """How a rank runs its share: ``micro_batch`` sequences per forward/backward pass, at least ``at_least`` passes
    (FSDP2: as many as the busiest rank; None: its own number), its loss scaled by ``loss_scale`` (the parallel
    strategy's), and with ``share_prompts`` a micro-batch's members of one prompt packed behind one copy of it
    (``swarmrl.rollouts.shared``) where the model allows it."""

    micro_batch: int
    at_least: int | None = None
    loss_scale: int = 1
    share_prompts: bool = False


@dataclass
class StepStats:
    loss: float  # this rank's share of the batch loss
    stats: LossStats  # over this rank's tokens


def accumulate_gradients(model, seqs: list[Sequence], loss_cfg: LossConfig, pad_id: int,  # noqa: ANN001
                         whole: WholeBatch, plan: Passes, ref_model=None) -> StepStats:  # noqa: ANN001
    """Backward over ``seqs`` (this rank's share of ``whole``) as ``plan`` says; returns stats for this share."""
    lengths = [s.model_tokens() for s in seqs]  # an environment's tokens are not trained nor counted
    weights_all = token_weights(lengths, loss_cfg.normalization, loss_cfg.constant, total_sequences=whole.sequences,
                                total_tokens=whole.tokens, max_tokens=whole.max_tokens)
    loss_sum, parts = 0.0, []
    objective = loss_cfg.objective()
    micro_batch = plan.micro_batch
    passes = max(math.ceil(len(seqs) / micro_batch), plan.at_least or 0)
    shared = plan.share_prompts and supports_shared(model)
    logprobs = shared_logprobs if shared else sequence_logprobs
    for start in range(0, passes * micro_batch, micro_batch):
        mb = seqs[start: start + micro_batch]
        if not mb:
            _null_pass(model, pad_id, ref_model if loss_cfg.kl_coef else None)
            continue
        packed = pack_shared(mb, pad_id) if shared else pack(mb, pad_id)
        temps = {s.temperature for s in mb}
        if len(temps) != 1:
            raise ValueError("a micro-batch mixes sampling temperatures")
        temp = temps.pop() or 1.0
        logp, ent = logprobs(model, packed, temp, with_entropy=True, entropy_grad=bool(loss_cfg.entropy_coef))
        w = torch.zeros_like(packed["old"])
        for i, s in enumerate(mb):
            p = 0 if shared else len(s.prompt_ids) - 1  # where completion token 0 sits in the layout
            if lengths[start + i]:  # one weight per sequence; the mask (``cmask``) leaves environment tokens out
                w[i, p: p + len(s.completion_ids)] = weights_all[start + i][0]
        adv = torch.tensor([s.advantage for s in mb], dtype=torch.float32)
        ref = None
        if ref_model is not None and loss_cfg.kl_coef:
            with torch.no_grad(), _reference(ref_model) as ref_net:
                ref, _ = logprobs(ref_net, packed, temp)
        st = policy_loss(objective, logp, packed["old"], adv, w, packed["cmask"], entropy=ent, ref_logp=ref)
        (st.loss * plan.loss_scale).backward()
        loss_sum += float(st.loss.detach())
        parts.append(st.stats)
    return StepStats(loss_sum, LossStats.combine(parts))
