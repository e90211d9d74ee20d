"""The inference backend interface: what local workers, swarm nodes and evaluation sample through.

A backend holds one policy (loaded from a model directory, or an in-memory model for ``ours``) and answers

- ``generate(prompt_ids, params, seeds=..., capture_hidden=...)``: one completion per prompt (repeat a prompt
  for a group) as a ``SampleOutput``: completion token ids (EOS included when produced), the sampled tokens'
  logprobs under logits / temperature (greedy: temperature 1), finished flags and, with ``capture_hidden``,
  each completion's final-norm hidden states (bf16, ``[len(completion), hidden]``) for TOPLOC proofs;
- ``update_weights(policy_dir_or_state)``: swap in a new policy version in place.

Randomness: ``seeds`` gives each request its own stream (its tokens depend on its seed and prompt, not on
the batch it is in); without seeds a backend draws from its own stream, seeded when it was made (``ours``:
the ``torch.Generator`` it was given, exactly the sampler's behaviour before backends existed).

Implementations: ``ours`` (``OursBackend``, the batched KV-cache sampler of ``swarmrl.inference.sampler``, the
default) and ``vllm`` (``swarmrl.inference.vllm_backend``, imported only when chosen).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import torch
from safetensors.torch import load_file

from swarmrl.inference.config import VLLM_INSTALL_HINT, BackendUnavailable, InferenceConfig
from swarmrl.inference.params import SamplingParams
from swarmrl.inference.sampler import SampleOutput, generate
from swarmrl.models.io import load_model

Weights = str | Path | Mapping[str, torch.Tensor]
__all__ = ["VLLM_INSTALL_HINT", "BackendUnavailable", "InferenceBackend", "OursBackend", "as_backend", "load_state",
           "load_state_into", "make_backend"]

class InferenceBackend(ABC):
    name: ClassVar[str]

    def __init__(self, eos_id: int, pad_id: int) -> None:
        self.eos_id = eos_id  # < 0: no token ends a completion early (every one runs to max_new_tokens)
        self.pad_id = pad_id

    @abstractmethod
    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams, *,
                 seeds: Sequence[int] | None = None, capture_hidden: bool = False) -> SampleOutput:
        """One completion per prompt; ``seeds``: one per prompt (None: the backend's own stream)."""

    @abstractmethod
    def update_weights(self, weights: Weights) -> None:
        """Load a policy version in place: a policy directory (``model.safetensors`` inside) or a state dict."""

    def close(self) -> None:  # noqa: B027  # optional hook: most backends hold nothing to release
        """Release what the backend holds (engines, memory)."""

    @staticmethod
    def _check_seeds(prompt_ids: Sequence[Sequence[int]], seeds: Sequence[int] | None) -> None:
        if seeds is not None and len(seeds) != len(prompt_ids):
            raise ValueError(f"{len(seeds)} seeds for {len(prompt_ids)} prompts")


def load_state(weights: Weights) -> Mapping[str, torch.Tensor]:
    """A state dict, or the one in a policy directory's ``model.safetensors``."""
    if isinstance(weights, Mapping):
        return weights
    p = Path(weights)
    return load_file(str(p / "model.safetensors" if p.is_dir() else p))


def load_state_into(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy ``state`` into ``model`` in place (the LM head may be tied to the embeddings, so it may be absent)."""
    missing, unexpected = model.load_state_dict(dict(state), strict=False)
    if unexpected or [m for m in missing if "lm_head" not in m]:
        raise ValueError(f"weights do not match the model: missing {missing}, unexpected {unexpected}")
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        model.tie_weights()
    model.eval()


class OursBackend(InferenceBackend):
    """The batched KV-cache sampler over an in-memory HF model (``generate`` is the sampler's, unchanged)."""

    name = "ours"

    def __init__(self, model: torch.nn.Module, eos_id: int, pad_id: int,
                 generator: torch.Generator | None = None) -> None:
        super().__init__(eos_id, pad_id)
        self.model = model
        self.generator = generator  # None: torch's global generator (as the sampler does)

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams, *,
                 seeds: Sequence[int] | None = None, capture_hidden: bool = False) -> SampleOutput:
        self._check_seeds(prompt_ids, seeds)
        gens = None
        if seeds is not None:
            device = next(self.model.parameters()).device
            gens = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]
        return generate(self.model, [list(p) for p in prompt_ids], params, self.eos_id, self.pad_id,
                        capture_hidden=capture_hidden, generator=self.generator, generators=gens)

    def update_weights(self, weights: Weights) -> None:
        load_state_into(self.model, load_state(weights))


def as_backend(policy: InferenceBackend | torch.nn.Module, eos_id: int, pad_id: int,
               generator: torch.Generator | None = None) -> InferenceBackend:
    """A backend as is, or an in-memory model wrapped in ``OursBackend`` (with ``generator``)."""
    if isinstance(policy, InferenceBackend):
        return policy
    return OursBackend(policy, eos_id, pad_id, generator)


def make_backend(cfg: InferenceConfig, model: str | Path | torch.nn.Module, *, eos_id: int, pad_id: int,
                 generator: torch.Generator | None = None, seed: int = 0) -> InferenceBackend:
    """The backend ``cfg`` names, holding ``model`` (a model directory; ``ours`` also takes a loaded model).
    ``generator`` is ``ours``'s stream, ``seed`` the vLLM backend's (both used when no seeds are given)."""
    if cfg.backend == "ours":
        if not isinstance(model, torch.nn.Module):
            model = load_model(model)
        return OursBackend(model, eos_id, pad_id, generator)
    if cfg.backend == "vllm":
        if isinstance(model, torch.nn.Module):
            raise ValueError("the vllm backend loads its policy from a model directory, not an in-memory model")
        from swarmrl.inference.vllm_backend import VLLMBackend  # noqa: PLC0415  # lazy: optional dependency

        return VLLMBackend(model, cfg.vllm, eos_id=eos_id, pad_id=pad_id, seed=seed)
    raise ValueError(f"unknown inference backend {cfg.backend!r}")
