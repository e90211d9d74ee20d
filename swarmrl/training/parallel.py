"""How a trainer's ranks share the model (``trainer.parallel``): every rank holds all of it, or FSDP2 shards it; and
the collectives the ranks meet in.

``"ddp"`` (``Replicated``): every rank holds the whole model and its optimizer state; after the backward passes
the gradients are summed with one all-reduce (each rank's weights already carry the global normalisation).

``"fsdp2"`` (``FullySharded``): ``torch.distributed.fsdp.fully_shard`` on every decoder layer and then on the
root, so parameters, gradients and optimizer state are split across the ranks (DTensors, one shard each). No
rank ever holds the whole model for training: it is built on the meta device, sharded, and only then
materialised, with rank 0 reading the weights file and broadcasting each rank its shards; the KL reference model
(when ``kl_coef > 0``) is sharded the same way. A forward pass all-gathers a layer's parameters and a backward
pass reduce-scatters its gradients (averaged over the ranks, so each rank's loss is scaled by the world size),
so every rank must run as many forward/backward passes as the busiest one: ``micro_batches`` says how many.
Publishing a version needs the whole weights once: ``gather_full_model`` (a collective) assembles them into a
model on rank 0 that lives only while that version is evaluated and written, so a published version is the same HF
safetensors directory as under "ddp". The optimizer's state is never gathered: ``training.checkpoint`` saves each
rank's shard by parameter name through ``torch.distributed.checkpoint``, so a checkpoint resumes under either mode
and any world size.

Every collective the trainer's loop needs is the strategy's: ``broadcast_from_lead`` (rank 0 computes a value,
the batch of a step, and every rank gets it), ``barrier``, ``sum_over_ranks`` (the whole batch's loss) and
``gather_full_model``; ``init_distributed`` joins torchrun's process group. With one rank there is nothing to
shard, reduce or wait for: both modes are the plain single-process trainer.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
from accelerate import init_empty_weights
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from swarmrl.models.io import load_model

T = TypeVar("T")


def init_distributed() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment (0, 1 without it); with several ranks, the default process
    group is joined (gloo on CPU, NCCL with CUDA) unless it already is."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo" if not torch.cuda.is_available() else "nccl")
    return rank, world


class Replicated:
    """Every rank holds the whole model; gradients are summed across ranks with one all-reduce."""

    def __init__(self, model: torch.nn.Module, world: int, rank: int) -> None:
        self.model, self.world, self.rank = model, world, rank
        self.loss_scale = 1  # weights are global and gradients summed: each rank's loss as it is

    @classmethod
    def load(cls, model_dir: str | Path, world: int, rank: int) -> Replicated:
        model = load_model(model_dir)
        model.train()
        return cls(model, world, rank)

    def gather_full_model(self) -> torch.nn.Module | None:
        """The whole model with the current weights on rank 0 (None elsewhere); every rank calls it."""
        return self.model if self.rank == 0 else None

    def broadcast_from_lead(self, make: Callable[[], T]) -> T:
        """Rank 0 calls ``make`` and every rank gets what it returned (pickled); every rank calls it."""
        value = make() if self.rank == 0 else None
        if self.world > 1:
            box = [value]
            torch.distributed.broadcast_object_list(box, src=0)
            value = box[0]
        return value  # type: ignore[return-value]

    def barrier(self) -> None:
        """Wait until every rank has come here."""
        if self.world > 1:
            torch.distributed.barrier()

    def sum_over_ranks(self, x: float) -> float:
        """The sum of every rank's ``x`` (the same number on every rank)."""
        if self.world == 1:
            return x
        t = torch.tensor([x], dtype=torch.float64, device=next(self.model.parameters()).device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
        return float(t.item())

    def micro_batches(self, shares: list[int], micro_batch: int) -> int | None:
        """Forward/backward passes every rank must run, given each rank's sequences (None: its own number)."""
        return None

    def reduce_grads(self) -> None:
        if self.world > 1:
            allreduce_grads(self.model)


class FullySharded(Replicated):
    """FSDP2: parameters, gradients and optimizer state sharded across the ranks (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, world: int, rank: int) -> None:
        super().__init__(model, world, rank)
        self.loss_scale = world  # FSDP averages the reduce-scattered gradients over the ranks

    @classmethod
    def load(cls, model_dir: str | Path, world: int, rank: int) -> FullySharded:
        model = load_sharded(model_dir, rank)
        model.train()
        return cls(model, world, rank)

    def gather_full_model(self) -> torch.nn.Module | None:
        """Collective: the full weights, as a model on rank 0 built around them (None elsewhere)."""
        weights = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank != 0:
            return None
        return _model_around(self.model.config, weights)

    def micro_batches(self, shares: list[int], micro_batch: int) -> int | None:
        return max(math.ceil(n / micro_batch) for n in shares)

    def reduce_grads(self) -> None:
        pass  # done by the backward passes (reduce-scatter)


def load_sharded(model_dir: str | Path, rank: int) -> PreTrainedModel:
    """The model of ``model_dir`` built on the meta device, sharded with FSDP2 (each decoder layer, then the root)
    and materialised shard by shard: only rank 0 reads the weights, and no rank holds more than its shards (rank 0
    holds the file's tensors until they are sent). Collective: every rank of the default group calls it."""
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    with init_empty_weights(include_buffers=False):  # parameters on meta; buffers (rotary tables) computed here
        model = AutoModelForCausalLM.from_config(config)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()  # from_config on meta does not tie: one parameter for the embeddings and the LM head
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)  # the rest: embeddings, (tied) LM head, final norm
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)  # in place: a tied parameter stays one parameter
    try:
        model.to_empty(device="cpu")  # shards allocated, uninitialised; the buffers too, so they are put back
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
    for n, b in model.named_buffers():
        b.copy_(buffers[n])
    full: dict[str, torch.Tensor] = {}
    if rank == 0:
        full = load_file(str(Path(model_dir) / "model.safetensors"))
        if getattr(config, "tie_word_embeddings", False) and "lm_head.weight" not in full:
            full["lm_head.weight"] = full[next(k for k in full if k.endswith("embed_tokens.weight"))]
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    return model


def _model_around(config, weights: dict[str, torch.Tensor]) -> PreTrainedModel:  # noqa: ANN001
    """A plain model holding ``weights`` (no copy, no random initialisation)."""
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(weights, assign=True, strict=False)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    model.eval()
    return model


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's transformer blocks: the modules HF declares unsplittable (``_no_split_modules``)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def allreduce_grads(model: torch.nn.Module) -> None:
    """Sum gradients across ranks in one flat buffer (weights already hold the global normalisation)."""
    for p in model.parameters():  # a rank with no sequences still joins with zeros
        if p.requires_grad and p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    torch.distributed.all_reduce(flat, op=torch.distributed.ReduceOp.SUM)
    off = 0
    for g in grads:
        g.copy_(flat[off: off + g.numel()].view_as(g))
        off += g.numel()


def build_parallel(mode: str, model_dir: str | Path, world: int, rank: int) -> Replicated:
    """``trainer.parallel``'s strategy with the model of ``model_dir`` loaded its way ("fsdp2" with more than one
    rank: sharded; otherwise a whole copy)."""
    if mode == "fsdp2" and world > 1:
        return FullySharded.load(model_dir, world, rank)
    return Replicated.load(model_dir, world, rank)


__all__ = ["Replicated", "FullySharded", "build_parallel", "init_distributed", "load_sharded", "decoder_layers",
           "allreduce_grads"]
