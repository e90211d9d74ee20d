"""How the trainer's ranks share the model (``trainer.parallel``): every rank holds all of it, or FSDP2 shards it.

``"ddp"`` (``Replicated``): every rank holds the whole model and its optimizer state; after the backward passes
the gradients are summed with one all-reduce (each rank's weights already carry the global normalisation).

``"fsdp2"`` (``FullySharded``): ``torch.distributed.fsdp.fully_shard`` on every decoder layer and then on the
root, so parameters, gradients and optimizer state are split across the ranks (DTensors, one shard each). A
forward pass all-gathers a layer's parameters and a backward pass reduce-scatters its gradients (averaged over the
ranks, so each rank's loss is scaled by the world size), so every rank must run as many forward/backward passes
as the busiest one: ``micro_batches`` says how many. Commits and evaluations need the full weights:
``sync_full_model`` gathers them (a collective every rank joins) into a plain copy of the model that rank 0 keeps
for evaluation and ``save_pretrained`` (so a published version is the same HF safetensors directory as under
"ddp"). The optimizer's state is never gathered: ``rl.state`` saves each rank's shard by parameter name through
``torch.distributed.checkpoint``, so a checkpoint resumes under either mode and any world size.

With one rank there is nothing to shard or reduce: both modes are the plain single-process trainer.
"""

from __future__ import annotations

import copy
import math

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class Replicated:
    """Every rank holds the whole model; gradients are summed across ranks with one all-reduce."""

    def __init__(self, model: torch.nn.Module, world: int, rank: int) -> None:
        self.model, self.world, self.rank = model, world, rank
        self.loss_scale = 1  # weights are global and gradients summed: each rank's loss as it is

    @property
    def full_model(self) -> torch.nn.Module | None:
        """The whole model with the current weights (rank 0): what evaluation and commits use."""
        return self.model

    def micro_batches(self, shares: list[int], micro_batch: int) -> int | None:
        """Forward/backward passes every rank must run, given each rank's sequences (None: its own number)."""
        return None

    def reduce_grads(self) -> None:
        if self.world > 1:
            allreduce_grads(self.model)

    def sync_full_model(self) -> None:
        """Bring ``full_model`` up to date with the weights (every rank calls it)."""


class FullySharded(Replicated):
    """FSDP2: parameters, gradients and optimizer state sharded across the ranks (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, world: int, rank: int) -> None:
        super().__init__(model, world, rank)
        # rank 0's whole copy for evaluation and publishing: plain tensors, outside autograd
        self._full = copy.deepcopy(model).requires_grad_(False) if rank == 0 else None
        mesh = init_device_mesh(next(model.parameters()).device.type, (world,))
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)  # the rest: embeddings, (tied) LM head, final norm
        self.loss_scale = world  # FSDP averages the reduce-scattered gradients over the ranks

    @property
    def full_model(self) -> torch.nn.Module | None:
        return self._full

    def micro_batches(self, shares: list[int], micro_batch: int) -> int | None:
        return max(math.ceil(n / micro_batch) for n in shares)

    def reduce_grads(self) -> None:
        pass  # done by the backward passes (reduce-scatter)

    def sync_full_model(self) -> None:
        """Collective: gathers the full weights into rank 0's copy."""
        weights = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank == 0:
            self._full.load_state_dict(weights)  # in place: a tied LM head stays tied (deepcopy kept the tie)


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


def make_parallel(mode: str, model: torch.nn.Module, world: int, rank: int) -> Replicated:
    """``trainer.parallel``'s strategy for ``model`` (wraps it in place under "fsdp2" with more than one rank)."""
    if mode == "fsdp2" and world > 1:
        return FullySharded(model, world, rank)
    return Replicated(model, world, rank)


__all__ = ["Replicated", "FullySharded", "make_parallel", "decoder_layers", "allreduce_grads"]
