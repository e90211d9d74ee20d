"""The LoRA adapter file as a policy version (names, settings, the base marker): no torch, so light processes read it.

One safetensors file (``ADAPTER_FILE``) is the whole version on the wire: in peft's naming
(``base_model.model.<module>.lora_A.weight`` [r, in] and ``.lora_B.weight`` [out, r]) the two factors of every
adapted linear layer, and in its metadata (``META_KEY``) the adapter's settings (rank, alpha, target modules) and
the content hash of the base it applies to. A version directory also holds peft's ``adapter_config.json`` (so
``PeftModel.from_pretrained`` reads it) and ``BASE_MARKER``, both written from the same settings.
``swarmrl.models.lora`` checks and merges adapters.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
BASE_MARKER = "lora_base.json"
MODEL_FILE = "model.safetensors"
META_KEY = "swarmrl_lora"
FORMAT = "swarmrl-lora/1"
# the attention and MLP projections of Qwen2 / Llama-style decoders
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MAX_RANK = 256
MAX_HEADER_BYTES = 1 << 20  # an adapter's header: names, shapes and settings


class AdapterRefused(ValueError):
    """An adapter that does not fit the base it would be applied to (or is no adapter at all)."""


@dataclass(frozen=True)
class AdapterSpec:
    """An adapter's settings and the base it applies to (the file's metadata)."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    base_hash: str

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def to_meta(self) -> dict[str, str]:
        return {META_KEY: json.dumps({"format": FORMAT, "rank": self.rank, "alpha": self.alpha,
                                      "target_modules": list(self.target_modules), "base_hash": self.base_hash})}

    @classmethod
    def from_meta(cls, meta: dict[str, str] | None) -> AdapterSpec:
        try:
            d = json.loads((meta or {})[META_KEY])
            if d.get("format") != FORMAT:
                raise AdapterRefused(f"unknown adapter format {d.get('format')!r} (this holder reads {FORMAT})")
            spec = cls(int(d["rank"]), float(d["alpha"]), tuple(str(t) for t in d["target_modules"]),
                       str(d["base_hash"]))
        except AdapterRefused:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise AdapterRefused(f"no readable adapter settings in the file's metadata ({e!r})") from None
        if not 1 <= spec.rank <= MAX_RANK:
            raise AdapterRefused(f"rank {spec.rank} outside 1..{MAX_RANK}")
        if not (math.isfinite(spec.alpha) and spec.alpha > 0):
            raise AdapterRefused(f"alpha {spec.alpha} must be a positive number")
        if not re.fullmatch(r"[0-9a-f]{64}", spec.base_hash):
            raise AdapterRefused("base_hash is not a 64-digit hex digest")
        return spec


def weights_file(d: Path) -> Path | None:
    """A version directory's weights: the full model's or the adapter's file (None: neither is there yet)."""
    for name in (MODEL_FILE, ADAPTER_FILE):
        if (d / name).is_file():
            return d / name
    return None


def header_metadata(path: Path) -> dict[str, str] | None:
    """A safetensors file's ``__metadata__``, read from its header alone (None: no readable header). The header
    is bounded (``MAX_HEADER_BYTES``) and the body never read, so a padded or oversize file is still told."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 2 <= n <= MAX_HEADER_BYTES:
                return None
            header = json.loads(f.read(n))
    except (OSError, ValueError):
        return None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else {}


def is_adapter_file(path: Path) -> bool:
    """Does this safetensors file hold an adapter (told by its metadata, whatever its name)?"""
    return META_KEY in (header_metadata(path) or {})


def write_sidecars(d: Path, spec: AdapterSpec) -> None:
    """``adapter_config.json`` (peft's) and ``BASE_MARKER`` from the adapter's settings."""
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": spec.rank, "lora_alpha": spec.alpha,
           "target_modules": list(spec.target_modules), "lora_dropout": 0.0, "bias": "none",
           "fan_in_fan_out": False, "use_rslora": False, "inference_mode": True, "base_model_name_or_path": None}
    (d / ADAPTER_CONFIG).write_text(json.dumps(cfg, indent=1))
    (d / BASE_MARKER).write_text(json.dumps({"base_hash": spec.base_hash, "format": FORMAT}))


__all__ = ["ADAPTER_CONFIG", "ADAPTER_FILE", "AdapterRefused", "AdapterSpec", "BASE_MARKER", "DEFAULT_TARGETS",
           "FORMAT", "MAX_RANK", "META_KEY", "MODEL_FILE", "header_metadata", "is_adapter_file", "weights_file", "write_sidecars"]
