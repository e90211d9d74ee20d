"""``PolicyHolder``: one model in memory whose weights are swapped to the version asked for; ``BackendPolicy``: the
version an inference backend serves (``PolicyHolder`` under ``ours``, in-place reloads under other backends).

Trainer (resume from version N), local workers (newest version), swarm nodes (the version an assignment
names) and the validator (the version a row claims) all hold their policy through it. A swap loads the
version's ``model.safetensors`` into the existing modules (no new model object, no re-reading the config);
``keep_states`` keeps that many recent versions' tensors in memory so switching back and forth between
versions (the validator, row by row) costs a copy, not a file read.

A version whose directory holds a LoRA adapter (``swarmrl.models.lora``) is applied merged onto the base the
holder was built from: the adapter is checked against that base (its content hash, every tensor's name and
shape, its size) and refused (``PolicyUnavailable``) when it does not fit. The first adapter makes the holder
keep the base's weights beside the model's (read again from ``base_model_dir``: the model may hold another
version by then), so each adapter merges onto the base, never onto a previous version.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from swarmrl.inference.backend import InferenceBackend, make_backend
from swarmrl.inference.config import InferenceConfig
from swarmrl.models.adapter_file import AdapterRefused, is_adapter_file, weights_file
from swarmrl.models.io import load_model
from swarmrl.models.lora import read_adapter, state_hash
from swarmrl.policy.sources import PolicySource, PolicyUnavailable


class PolicyHolder:
    def __init__(self, source: PolicySource, base_model_dir: str | Path, keep_states: int = 0) -> None:
        self.source = source
        self.base_dir = Path(base_model_dir)
        self.model = load_model(base_model_dir)
        self.model.eval()
        self.version = -1  # the base model is loaded, but no version has been swapped in yet
        self.keep_states = keep_states
        self._states: OrderedDict[int, dict[str, torch.Tensor]] = OrderedDict()
        self._base: tuple[dict[str, torch.Tensor], str] | None = None  # the base's weights and hash (adapters)

    def load(self, version: int, timeout_s: float = 60.0) -> torch.nn.Module:
        """The model with version ``version``'s weights (``PolicyUnavailable`` when it cannot be had)."""
        if version == self.version:
            return self.model
        state = self._states.get(version)
        if state is None:
            d = self.source.fetch(version, timeout_s)
            path = weights_file(d) or d / "model.safetensors"
            try:
                state = self._adapted(path) if is_adapter_file(path) else load_file(str(path))
            except AdapterRefused as e:
                raise PolicyUnavailable(f"policy v{version}: LoRA adapter refused: {e}") from None
            except (OSError, ValueError, SafetensorError) as e:  # vanished, truncated or malformed file
                raise PolicyUnavailable(f"policy v{version}: {e}") from None
        self.swap(version, state)
        return self.model

    def base_state(self) -> tuple[dict[str, torch.Tensor], str]:
        """The base model's weights (as loaded from ``base_model_dir``) and their content hash, read once."""
        if self._base is None:
            base = load_model(self.base_dir).state_dict()
            self._base = (base, state_hash(base))
        return self._base

    def _adapted(self, path: Path) -> dict[str, torch.Tensor]:
        """The whole weights of an adapter version: the base's, with the adapted layers merged."""
        base, digest = self.base_state()
        adapter = read_adapter(path, base, digest)
        return {**base, **adapter.merged(base)}

    def swap(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """Copy ``state`` into the model in place (the LM head may be tied to the embeddings)."""
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or [m for m in missing if "lm_head" not in m]:
            raise PolicyUnavailable(f"policy v{version} does not match the model: missing {missing}, "
                                    f"unexpected {unexpected}")
        if getattr(self.model.config, "tie_word_embeddings", False):
            self.model.tie_weights()
        self.model.eval()
        self.version = version
        if self.keep_states:
            self._states[version] = state
            self._states.move_to_end(version)
            while len(self._states) > self.keep_states:
                self._states.popitem(last=False)


class BackendPolicy:
    """The policy version an inference backend serves (local workers and swarm nodes sample through it).

    ``ours``: a ``PolicyHolder`` swaps the in-memory model the backend wraps (exactly the pre-backend path); other
    backends reload each version's directory in place (``InferenceBackend.update_weights``) and no HF model is held
    here at all."""

    def __init__(self, source: PolicySource, base_model_dir: str | Path, inference: InferenceConfig, *, eos_id: int,
                 pad_id: int, generator: torch.Generator | None = None, seed: int = 0) -> None:
        self.source = source
        self.holder: PolicyHolder | None = None
        self._version = -1
        if inference.backend == "ours":
            self.holder = PolicyHolder(source, base_model_dir)
            self.backend: InferenceBackend = make_backend(inference, self.holder.model, eos_id=eos_id, pad_id=pad_id,
                                                          generator=generator)
        else:
            self.backend = make_backend(inference, base_model_dir, eos_id=eos_id, pad_id=pad_id, seed=seed)

    @property
    def version(self) -> int:
        return self.holder.version if self.holder is not None else self._version

    @property
    def model(self) -> torch.nn.Module | None:
        """The in-memory HF model (``ours`` only; None for backends that hold their own copy)."""
        return self.holder.model if self.holder is not None else None

    def load(self, version: int, timeout_s: float = 60.0) -> InferenceBackend:
        """The backend serving version ``version`` (``PolicyUnavailable`` when it cannot be had)."""
        if self.holder is not None:
            self.holder.load(version, timeout_s)
        elif version != self._version:
            path = self.source.fetch(version, timeout_s)
            w = weights_file(path)
            if w is not None and is_adapter_file(w):
                raise PolicyUnavailable(f"policy v{version} is a LoRA adapter: only inference.backend = 'ours' "
                                        "applies adapters (export a merged model with `swarmrl model export`)")
            try:
                self.backend.update_weights(path)
            except (OSError, ValueError, SafetensorError) as e:  # vanished, truncated or malformed files
                raise PolicyUnavailable(f"policy v{version}: {e}") from None
            self._version = version
        return self.backend
