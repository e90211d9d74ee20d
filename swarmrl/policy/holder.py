"""``PolicyHolder``: one model in memory whose weights are swapped to the version asked for.

Trainer (resume from version N), local workers (newest version), swarm nodes (the version an assignment
names) and the validator (the version a row claims) all hold their policy through it. A swap loads the
version's ``model.safetensors`` into the existing modules (no new model object, no re-reading the config);
``keep_states`` keeps that many recent versions' tensors in memory so switching back and forth between
versions (the validator, row by row) costs a copy, not a file read.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import torch
from safetensors.torch import load_file

from swarmrl.models.io import load_model
from swarmrl.policy.sources import PolicySource, PolicyUnavailable


class PolicyHolder:
    def __init__(self, source: PolicySource, base_model_dir: str | Path, keep_states: int = 0) -> None:
        self.source = source
        self.model = load_model(base_model_dir)
        self.model.eval()
        self.version = -1  # the base model is loaded, but no version has been swapped in yet
        self.keep_states = keep_states
        self._states: OrderedDict[int, dict[str, torch.Tensor]] = OrderedDict()

    def load(self, version: int, timeout_s: float = 60.0) -> torch.nn.Module:
        """The model with version ``version``'s weights (``PolicyUnavailable`` when it cannot be had)."""
        if version == self.version:
            return self.model
        state = self._states.get(version)
        if state is None:
            path = self.source.fetch(version, timeout_s) / "model.safetensors"
            try:
                state = load_file(str(path))
            except (OSError, ValueError) as e:  # vanished or truncated file
                raise PolicyUnavailable(f"policy v{version}: {e}") from None
        self.swap(version, state)
        return self.model

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
