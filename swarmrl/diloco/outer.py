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
off the accelerator"). What is all-reduced may be cast to fp16/bf16 (``compress``) and cast back,
or quantized to int8 with one scale per chunk shared by the group (``Int8Chunked``): the scales
are the group-wide per-chunk absolute maximum (a tiny MAX all-reduce first), and each worker's
value is rounded to ``levels = 127 // W`` steps per side, so the int8 SUM of W workers never
overflows and a plain all-reduce adds them. With error feedback the rounding residual is kept and
added to the next round's pseudo-gradient (nothing is lost, only delayed).

``apply_delayed`` is the overlapped (streaming-DiLoCo style) outer step: the all-reduce of round
k runs while the workers take the next ``tau`` inner steps; when it lands, the worker moves to the
new anchor plus the progress it made meanwhile.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Literal

import torch

__all__ = [
    "WireDtype", "flatten", "unflatten_into", "pseudo_gradient", "OuterNesterov", "compress", "decompress",
    "wire_bytes", "params_digest", "Int8Chunked", "int8_levels", "apply_delayed",
]

WireDtype = Literal["fp32", "fp16", "bf16", "int8"]
_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def wire_dtype(name: WireDtype) -> torch.dtype:
    if name == "int8":
        raise ValueError("int8 is not a cast: use Int8Chunked (scaled quantization)")
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


def wire_bytes(numel: int, dtype: WireDtype, chunk: int = 4096) -> int:
    """Bytes one worker hands to the collectives per round (int8: the values plus fp32 chunk scales)."""
    if dtype == "int8":
        return numel + 4 * Int8Chunked(chunk).n_chunks(numel)
    return numel * torch.empty((), dtype=wire_dtype(dtype)).element_size()


def int8_levels(world: int) -> int:
    """Quantization steps per side so that the int8 sum of ``world`` values cannot overflow."""
    if world < 1 or world > 127:
        raise ValueError("int8 all-reduce supports 1..127 workers")
    return 127 // world


class Int8Chunked:
    """Symmetric int8 quantization with one scale per ``chunk`` consecutive elements.

    ``scale_c = absmax_c / levels``; ``q = round(x / scale_c)`` clamped to ``[-levels, levels]``.
    If ``absmax`` bounds ``|x|`` chunk-wise, the round-trip error is at most ``scale_c / 2``.
    """

    def __init__(self, chunk: int = 4096) -> None:
        if chunk < 1:
            raise ValueError("chunk must be >= 1")
        self.chunk = chunk

    def n_chunks(self, numel: int) -> int:
        return -(-numel // self.chunk)

    def _padded(self, x: torch.Tensor) -> torch.Tensor:
        n = x.numel()
        pad = self.n_chunks(n) * self.chunk - n
        flat = x.reshape(-1).float()
        if pad:
            flat = torch.cat([flat, flat.new_zeros(pad)])
        return flat.view(-1, self.chunk)

    def absmax(self, x: torch.Tensor) -> torch.Tensor:
        """Per-chunk max |x| (fp32, ``n_chunks`` long)."""
        if x.numel() == 0:
            return torch.zeros(0)
        return self._padded(x).abs().amax(dim=1)

    def scales(self, absmax: torch.Tensor, levels: int) -> torch.Tensor:
        s = absmax.float() / levels
        return torch.where(s > 0, s, torch.ones_like(s))  # all-zero chunk: any scale, q = 0

    def quantize(self, x: torch.Tensor, absmax: torch.Tensor, levels: int) -> torch.Tensor:
        if not 1 <= levels <= 127:
            raise ValueError("levels must be in 1..127")
        if absmax.numel() != self.n_chunks(x.numel()):
            raise ValueError("absmax has the wrong number of chunks")
        q = torch.round(self._padded(x) / self.scales(absmax, levels)[:, None]).clamp_(-levels, levels)
        return q.reshape(-1)[: x.numel()].to(torch.int8)

    def dequantize(self, q: torch.Tensor, absmax: torch.Tensor, levels: int, divisor: float = 1.0) -> torch.Tensor:
        """``q * scale / divisor`` in fp32 (``q`` may be the int8 sum over the group; divisor W gives the mean)."""
        n = q.numel()
        scale = self.scales(absmax, levels) / divisor
        return (self._padded(q.float()) * scale[:, None]).reshape(-1)[:n]


def apply_delayed(new_anchor: torch.Tensor, sent_from: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """Overlapped outer step: the new anchor plus the local progress made since the pseudo-gradient was sent.

    ``sent_from`` is the worker's parameters when it computed the pseudo-gradient, ``current`` its
    parameters now (``tau`` inner steps later). With ``tau = 0`` this is just ``new_anchor``.
    """
    if not new_anchor.shape == sent_from.shape == current.shape:
        raise ValueError("anchor, sent and current parameters differ in shape")
    return new_anchor.float() + (current.float() - sent_from.float())


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


def params_digest(flat: torch.Tensor) -> str:
    """A short hash of a flat parameter vector (to check workers hold identical parameters)."""

    return hashlib.sha256(flat.detach().cpu().float().contiguous().numpy().tobytes()).hexdigest()[:16]
