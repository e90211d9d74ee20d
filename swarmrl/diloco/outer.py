"""DiLoCo core math, free of processes and networks (so it is unit-testable).

DiLoCo (Douillard et al. 2023; OpenDiLoCo, Jaghouar et al. 2024): every worker runs H inner
AdamW steps on its own data, then the workers average their *pseudo-gradients*

    delta_w = theta_anchor - theta_w          (parameters at the last sync minus parameters now)

and every worker applies the same outer step to its copy of the anchor with SGD + Nesterov
momentum (the PyTorch ``SGD(nesterov=True)`` convention, dampening 0):

    buf   = g                       on the first outer step
    buf   = mu * buf + g            afterwards
    theta = theta - lr * (g + mu * buf)

The anchor parameters and the momentum buffer are kept as flat fp32 CPU tensors ("outer state
off the accelerator"). What is all-reduced may be cast to fp16/bf16 (``compress``) and cast back.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from typing import Literal

import torch

__all__ = [
    "WireDtype", "flatten", "unflatten_into", "pseudo_gradient", "OuterNesterov", "compress", "decompress",
    "wire_bytes", "warmup_cosine", "params_digest",
]

WireDtype = Literal["fp32", "fp16", "bf16"]
_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def wire_dtype(name: WireDtype) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"wire dtype must be one of {sorted(_DTYPES)}, not {name!r}") from None


def flatten(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """One contiguous fp32 CPU vector holding all ``tensors`` (detached copies)."""
    parts = [t.detach().reshape(-1).to(device="cpu", dtype=torch.float32) for t in tensors]
    if not parts:
        return torch.zeros(0)
    return torch.cat(parts)


def unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy ``flat`` back into ``tensors`` (in place, any device/dtype)."""
    total = sum(t.numel() for t in tensors)
    if flat.numel() != total:
        raise ValueError(f"flat vector has {flat.numel()} elements, the tensors need {total}")
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset: offset + n].view_as(t))
            offset += n


def pseudo_gradient(anchor: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """Parameters at the last sync minus parameters now (flat vectors of equal size)."""
    if anchor.shape != current.shape:
        raise ValueError(f"anchor {tuple(anchor.shape)} and current {tuple(current.shape)} differ in shape")
    return anchor.float() - current.float().to(anchor.device)


def compress(t: torch.Tensor, dtype: WireDtype) -> torch.Tensor:
    """What is handed to the all-reduce: ``t`` cast to the wire dtype (no copy for fp32)."""
    return t.to(wire_dtype(dtype))


def decompress(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32)


def wire_bytes(numel: int, dtype: WireDtype) -> int:
    return numel * torch.empty((), dtype=wire_dtype(dtype)).element_size()


class OuterNesterov:
    """SGD with Nesterov momentum over a flat fp32 CPU anchor (the parameters at the last sync)."""

    def __init__(self, anchor: torch.Tensor, lr: float = 0.7, momentum: float = 0.9) -> None:
        if lr <= 0 or not 0 <= momentum < 1:
            raise ValueError("outer lr must be > 0 and momentum in [0, 1)")
        self.anchor = anchor.detach().to(device="cpu", dtype=torch.float32).clone()
        self.lr, self.momentum = lr, momentum
        self.buf: torch.Tensor | None = None
        self.steps = 0

    def step(self, grad: torch.Tensor) -> torch.Tensor:
        """Apply one outer step with the (averaged) pseudo-gradient; returns the new anchor."""
        g = grad.detach().to(device="cpu", dtype=torch.float32)
        if g.shape != self.anchor.shape:
            raise ValueError(f"pseudo-gradient {tuple(g.shape)} does not match anchor {tuple(self.anchor.shape)}")
        if not torch.isfinite(g).all():
            raise FloatingPointError("non-finite pseudo-gradient (fp16 overflow or diverged worker)")
        if self.momentum > 0:
            if self.buf is None:
                self.buf = g.clone()
            else:
                self.buf.mul_(self.momentum).add_(g)
            update = g + self.momentum * self.buf
        else:
            update = g
        self.anchor.add_(update, alpha=-self.lr)
        self.steps += 1
        return self.anchor

    def state(self) -> dict:
        return {"anchor": self.anchor.clone(), "buf": None if self.buf is None else self.buf.clone(),
                "steps": self.steps, "lr": self.lr, "momentum": self.momentum}

    def load_state(self, anchor: torch.Tensor, buf: torch.Tensor | None, steps: int) -> None:
        if anchor.shape != self.anchor.shape:
            raise ValueError(f"loaded anchor {tuple(anchor.shape)} does not match {tuple(self.anchor.shape)}")
        if buf is not None and buf.shape != self.anchor.shape:
            raise ValueError("loaded momentum buffer does not match the anchor")
        self.anchor = anchor.detach().to(device="cpu", dtype=torch.float32).clone()
        self.buf = None if buf is None else buf.detach().to(device="cpu", dtype=torch.float32).clone()
        self.steps = int(steps)


def warmup_cosine(step: int, warmup: int, total: int, min_ratio: float = 0.1) -> float:
    """LR multiplier: linear warmup over ``warmup`` steps, then cosine decay to ``min_ratio`` at ``total``."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def params_digest(flat: torch.Tensor) -> str:
    """A short hash of a flat parameter vector (to check workers hold identical parameters)."""

    return hashlib.sha256(flat.detach().cpu().float().contiguous().numpy().tobytes()).hexdigest()[:16]
