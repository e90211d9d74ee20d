"""The trainer's LoRA policy (``rl.lora``): the base model wrapped with peft, only the adapter trainable.

``LoraPolicy.wrap`` injects LoRA layers into the loaded base (``peft.get_peft_model``; the model object stays an
HF causal LM, its adapted linear layers now ``base + B @ A * alpha / r``) after recording the base's content hash
(``swarmrl.models.lora.state_hash``), which every adapter version names so holders refuse one made for another
base. ``save`` writes a version directory (the adapter file, its sidecars, the base's config and tokenizer; no
model weights); ``load`` puts a committed version's adapter back into the layers (resume), through the same
checks a holder applies. ``reference`` is the KL reference: the same modules with the adapter switched off, so
no second copy of the model is held. peft is imported on the first wrap (it takes seconds to import).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from swarmrl.models.adapter_file import ADAPTER_FILE, AdapterSpec
from swarmrl.models.lora import read_adapter, state_hash, write_adapter
from swarmrl.rl.config import LoraSection

if TYPE_CHECKING:
    from peft import PeftModel


def linear_names(model: torch.nn.Module) -> set[str]:
    """The last name part of every linear layer of ``model`` (what ``target_modules`` may name)."""
    return {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


class BaseReference:
    """The base model under a LoRA policy: its modules, run with the adapter disabled (``disabled()``)."""

    def __init__(self, peft_model: PeftModel) -> None:
        self.peft = peft_model
        self.model = peft_model.get_base_model()

    @contextlib.contextmanager
    def disabled(self) -> Iterator[torch.nn.Module]:
        with self.peft.disable_adapter():
            yield self.model


class LoraPolicy:
    def __init__(self, peft_model: PeftModel, spec: AdapterSpec, base: dict[str, torch.Tensor]) -> None:
        self.peft, self.spec = peft_model, spec
        self.model = peft_model.get_base_model()  # the HF model with the LoRA layers in it
        self._base_shapes = base  # name -> base weight (its shape checks a resumed adapter)

    @classmethod
    def wrap(cls, model: torch.nn.Module, section: LoraSection, seed: int = 0) -> LoraPolicy:
        """Inject LoRA layers into ``model`` (in place), their A factors drawn from ``seed`` (the global RNG is left
        as it was); ``ValueError`` names target modules the model does not have."""
        have = linear_names(model)
        missing = [t for t in section.target_modules if t not in have]
        if missing:
            raise ValueError(f"rl.lora.target_modules {missing} not found in the model (its linear layers: "
                             f"{sorted(have)})")
        from peft import LoraConfig, get_peft_model  # noqa: PLC0415  # lazy: peft takes seconds to import

        base = {k: v.detach() for k, v in model.state_dict().items()}
        spec = AdapterSpec(section.rank, section.alpha, tuple(section.target_modules), state_hash(base))
        cfg = LoraConfig(r=section.rank, lora_alpha=section.alpha, lora_dropout=section.dropout,
                         target_modules=list(section.target_modules), bias="none", task_type="CAUSAL_LM")
        with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            torch.manual_seed(seed)
            peft_model = get_peft_model(model, cfg)
        return cls(peft_model, spec, {k: torch.empty(v.shape, device="meta") for k, v in base.items()})

    def trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def adapter_tensors(self) -> dict[str, torch.Tensor]:
        """The adapter's factors in peft's file naming (``base_model.model.<module>.lora_A.weight``)."""
        from peft import get_peft_model_state_dict  # noqa: PLC0415  # lazy: see wrap

        return get_peft_model_state_dict(self.peft)

    def save(self, d: Path, tokenizer) -> None:  # noqa: ANN001
        """A version directory: the adapter (and sidecars), the base's config and the tokenizer."""
        write_adapter(d, self.adapter_tensors(), self.spec)
        self.model.config.save_pretrained(d)
        if getattr(self.model, "generation_config", None) is not None:
            self.model.generation_config.save_pretrained(d)
        tokenizer.save_pretrained(d)

    def save_base(self, d: Path, tokenizer) -> None:  # noqa: ANN001
        """Version 0: the base model itself, as a whole HF directory (the LoRA layers' own weights left out)."""
        sd = {k.replace(".base_layer.", "."): v for k, v in self.model.state_dict().items() if ".lora_" not in k}
        self.model.save_pretrained(d, state_dict=sd, safe_serialization=True)
        tokenizer.save_pretrained(d)

    def load(self, version_dir: Path) -> None:
        """Put a committed version's adapter into the LoRA layers (checked as any holder checks one)."""
        if not (version_dir / ADAPTER_FILE).is_file():
            raise ValueError(f"{version_dir} holds no LoRA adapter: the run was not started with rl.lora.enabled")
        adapter = read_adapter(version_dir / ADAPTER_FILE, self._base_shapes, self.spec.base_hash)
        if adapter.spec != self.spec:
            raise ValueError(f"{version_dir}: adapter settings {adapter.spec} differ from the config's {self.spec}")
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for module, (a, b) in adapter.factors.items():
                params[f"{module}.lora_A.default.weight"].copy_(a)
                params[f"{module}.lora_B.default.weight"].copy_(b)

    def reference(self) -> BaseReference:
        return BaseReference(self.peft)


__all__ = ["BaseReference", "LoraPolicy", "linear_names"]
