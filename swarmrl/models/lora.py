"""LoRA adapters as policy versions: checking one against a base model, merging it, writing and exporting.

The file format (names, metadata, the base marker) is ``swarmrl.models.adapter_file``'s. A holder applies an
adapter merged: ``W' = W + (alpha / r) * B @ A`` for each adapted layer (peft's ``merge_and_unload`` computes the
same), so sampling, TOPLOC proofs and the validator's recomputation all run on plain weights. The file comes
from another machine: ``read_adapter`` refuses (``AdapterRefused``) an adapter whose base hash differs from the
holder's base (``state_hash``), whose size, rank, names, shapes or dtypes do not fit that base, or whose values
are not finite, before any tensor is applied. Pure torch and safetensors (peft is the trainer's alone).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from blake3 import blake3
from safetensors import safe_open
from safetensors.torch import save_file

from swarmrl.models.adapter_file import (
    ADAPTER_FILE,
    MAX_HEADER_BYTES,
    MAX_RANK,
    AdapterRefused,
    AdapterSpec,
    is_adapter_file,
    weights_file,
    write_sidecars,
)
from swarmrl.models.io import load_model, load_tokenizer, save_model

_NAME = re.compile(r"^base_model\.model\.(?P<module>[A-Za-z0-9_.]+)\.lora_(?P<ab>[AB])\.weight$")
_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


@dataclass
class Adapter:
    spec: AdapterSpec
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # module -> (A, B)

    def merged(self, base: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The adapted layers' merged weights (``<module>.weight``), in the base weights' dtype."""
        out = {}
        for module, (a, b) in self.factors.items():
            w = base[f"{module}.weight"]
            out[f"{module}.weight"] = (w.float() + self.spec.scale * (b.float() @ a.float())).to(w.dtype)
        return out

    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.factors.values())


def state_hash(state: dict[str, torch.Tensor]) -> str:
    """BLAKE3 of a model's weights as held (names, dtypes, shapes and bytes, by name): the base's identity."""
    h = blake3()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def write_adapter(d: Path, tensors: dict[str, torch.Tensor], spec: AdapterSpec) -> Path:
    """Write the adapter file, peft's ``adapter_config.json`` and the base marker into ``d``."""
    path = d / ADAPTER_FILE
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path), metadata=spec.to_meta())
    write_sidecars(d, spec)
    return path


def max_adapter_bytes(base: dict[str, torch.Tensor], spec_rank: int = MAX_RANK) -> int:
    """The largest adapter file a base admits: rank ``MAX_RANK`` on every 2-D weight in float32, plus a header."""
    n = sum(spec_rank * (t.shape[0] + t.shape[1]) for t in base.values() if t.dim() == 2)
    return 4 * n + MAX_HEADER_BYTES


def read_adapter(path: Path, base: dict[str, torch.Tensor], base_hash: str, max_bytes: int | None = None) -> Adapter:
    """Read and check an adapter against ``base`` (its weights by name, as held) and ``base_hash``; raises
    ``AdapterRefused`` naming what does not fit."""
    size = path.stat().st_size
    limit = max_adapter_bytes(base) if max_bytes is None else max_bytes
    if size > limit:
        raise AdapterRefused(f"adapter file is {size:,} bytes, over the {limit:,} this base admits")
    try:
        with safe_open(str(path), framework="pt") as f:
            spec = AdapterSpec.from_meta(f.metadata())
            if spec.base_hash != base_hash:
                raise AdapterRefused(f"adapter applies to base {spec.base_hash[:16]}..., this holder's base is "
                                     f"{base_hash[:16]}... (a different base model)")
            shapes = {k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in f.keys()}
            _check_layout(shapes, base, spec)
            tensors = {k: f.get_tensor(k) for k in shapes}
    except AdapterRefused:
        raise
    except Exception as e:  # an unreadable or malformed file (safetensors raises its own error type)
        raise AdapterRefused(f"unreadable adapter file: {e}") from None
    adapter = Adapter(spec)
    for k, t in tensors.items():
        if not bool(torch.isfinite(t).all()):
            raise AdapterRefused(f"{k}: values not finite")
    for module in sorted({_NAME.match(k)["module"] for k in tensors}):
        pre = f"base_model.model.{module}"
        adapter.factors[module] = (tensors[f"{pre}.lora_A.weight"], tensors[f"{pre}.lora_B.weight"])
    return adapter


def _check_layout(shapes: dict[str, tuple[str, tuple[int, ...]]], base: dict[str, torch.Tensor],
                  spec: AdapterSpec) -> None:
    """Every tensor an A or B factor of a targeted 2-D base weight, both present, shapes [r, in] and [out, r]."""
    if not shapes:
        raise AdapterRefused("adapter holds no tensors")
    seen: dict[str, set[str]] = {}
    for k, (dtype, shape) in shapes.items():
        m = _NAME.match(k)
        if m is None:
            raise AdapterRefused(f"unexpected tensor name {k!r} (want base_model.model.<module>.lora_A/B.weight)")
        module, ab = m["module"], m["ab"]
        w = base.get(f"{module}.weight")
        if w is None or w.dim() != 2:
            raise AdapterRefused(f"{k}: the base has no linear layer {module!r}")
        if module.rsplit(".", 1)[-1] not in spec.target_modules:
            raise AdapterRefused(f"{k}: {module!r} is not among the adapter's target_modules")
        if dtype not in _DTYPES:
            raise AdapterRefused(f"{k}: dtype {dtype} (want one of {sorted(_DTYPES)})")
        out_f, in_f = w.shape
        want = (spec.rank, in_f) if ab == "A" else (out_f, spec.rank)
        if shape != want:
            raise AdapterRefused(f"{k}: shape {list(shape)}, the base's {module} needs {list(want)} at rank {spec.rank}")
        seen.setdefault(module, set()).add(ab)
    lone = sorted(m for m, s in seen.items() if s != {"A", "B"})
    if lone:
        raise AdapterRefused(f"layers with only one LoRA factor: {lone[:4]}")


def merge_into(model: torch.nn.Module, adapter: Adapter) -> None:
    """Apply ``adapter`` merged to ``model``'s weights in place (the base must be what the model holds)."""
    base = {k: v for k, v in model.state_dict().items()}
    with torch.no_grad():
        for name, w in adapter.merged(base).items():
            base[name].copy_(w)


def export_merged(base_dir: str | Path, version_dir: str | Path, out_dir: str | Path) -> Path:
    """A whole HF model directory (safetensors + tokenizer) of ``base_dir`` with ``version_dir``'s adapter merged."""
    model = load_model(base_dir)
    base = model.state_dict()
    path = weights_file(Path(version_dir))
    if path is None or not is_adapter_file(path):
        raise AdapterRefused(f"{version_dir} holds no LoRA adapter")
    merge_into(model, read_adapter(path, base, state_hash(base)))
    return save_model(model, load_tokenizer(base_dir), out_dir)


__all__ = ["Adapter", "export_merged", "max_adapter_bytes", "merge_into", "read_adapter", "state_hash",
           "write_adapter"]
