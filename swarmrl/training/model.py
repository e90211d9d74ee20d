"""The model a training loop trains, and the frozen reference some losses compare it with.

- ``build_model``: an HF model directory's model and tokenizer, or a fresh tiny model (``models.init_model``) when
  there is none: what SFT starts from (DiLoCo always starts fresh; the RL trainer loads through its parallel
  strategy, ``training.parallel``, which may build the model sharded);
- ``prepare_model``: put a loaded model in training shape: train mode, activation checkpointing when asked (each
  decoder layer recomputed in the backward pass, HF's own mechanism), and the memory hook that hands freed heap
  back before the embedding's gradient (``utils.memory``);
- ``build_reference``: a frozen copy of a model directory's model, held as the trainer holds its policy (sharded
  under FSDP2): the RL trainer's KL reference.
"""

from __future__ import annotations

from pathlib import Path

import torch

from swarmrl.models.config import ModelInitConfig
from swarmrl.models.io import load_model, load_tokenizer
from swarmrl.models.tiny import init_model
from swarmrl.training.parallel import build_parallel
from swarmrl.utils.memory import release_before_embedding_backward


def build_model(model_dir: str | Path | None, init: ModelInitConfig) -> tuple[torch.nn.Module, object]:
    """(model, tokenizer): ``model_dir``'s, or a fresh model made by ``init`` when ``model_dir`` is empty."""
    if model_dir:
        return load_model(model_dir), load_tokenizer(model_dir)
    return init_model(init)


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in the backward pass (non-reentrant), by HF's own switch."""
    kw = {"use_reentrant": False}
    enable = getattr(model, "activation_checkpointing_enable", None)  # its name since transformers 5.x
    if enable is not None:
        enable(activation_checkpointing_kwargs=kw)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)


def prepare_model(model: torch.nn.Module, *, activation_checkpointing: bool = False,
                  release_memory: bool = False) -> torch.nn.Module:
    """``model`` in train mode, with activation checkpointing and the release of freed heap before the embedding's
    gradient (``release_memory``: the embedding's gradient then fits into the freed activations) when asked."""
    model.train()
    if activation_checkpointing:
        enable_activation_checkpointing(model)
    if release_memory:
        release_before_embedding_backward(model)
    return model


def build_reference(parallel: str, model_dir: str | Path, world: int = 1, rank: int = 0) -> torch.nn.Module:
    """A frozen copy of ``model_dir``'s model held the ``parallel`` way (``training.parallel``): eval mode, no
    gradients. Collective under FSDP2 (every rank calls it)."""
    ref = build_parallel(parallel, model_dir, world, rank).model
    ref.eval().requires_grad_(False)
    return ref
