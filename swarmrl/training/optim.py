"""AdamW as every training loop builds it (the RL trainer, SFT, DiLoCo's inner steps), and where its memory goes.

Full fine-tuning in float32 holds, besides the weights (4 bytes a parameter), their gradients (4) and AdamW's
two moments (8): on SmolLM2-135M that is 2.15 GB before any activation. ``build_optimizer`` picks:

- ``torch.optim.AdamW`` with ``fused=True`` when every moment and gradient is float32 (the default): one kernel per
  step over each tensor, no temporary the size of the model (the ``foreach`` form allocates one for the
  denominator; ``benchmarks/rl/memory.py`` measures both);
- ``LowMemoryAdamW`` when ``optim.state_dtype`` or ``optim.grad_dtype`` is ``bfloat16``: the same update, with the
  moments (``state_dtype``) and / or the gradients between the backward pass and the step (``grad_dtype``) held in
  bfloat16, 2 bytes each instead of 4. Its arithmetic is torch's fused AdamW kernel on float32 slices of ``CHUNK``
  elements, which stay in the CPU's cache (the clip's scale applied to each slice on the way in). bfloat16
  moments are what DeepSeek-V3 trained with (its technical report, on low-precision storage: no observable
  degradation); the gradients are rounded once, when their last micro-batch is accumulated, and the clipping norm
  is taken from them in float32 before that rounding.

Why not an 8-bit optimizer from a library: in a probe on SmolLM2-135M (one thread, no checkpointing)
bitsandbytes 0.50's CPU AdamW8bit took ~3.5 s a step and torchao 0.18's AdamW8bit ~5.4 s (after a 45 s
``torch.compile``), against ~0.2 s for the fused AdamW, and their float32 temporaries per parameter left peaks of
2.8-3.0 GB, where bfloat16 moments gave 2.9 GB.

``build_optimizer(..., fused=False)`` is torch's AdamW as torch picks its implementation (a loop over the tensors on
CPU, ``foreach`` on a GPU): DiLoCo's inner optimizer, whose figures and DDP comparisons were measured with it.

``clip_gradients`` is the one call for the global norm clip, wherever the gradients are held.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

CHUNK = 1 << 16  # elements per slice of LowMemoryAdamW's float32 arithmetic (256 KB a temporary: they stay in
# the CPU's cache; 16K and 256K-1M slices were slower on SmolLM2's step; benchmarks/rl/memory.py --optimizer-only
# times it against torch's AdamW)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class LowMemoryAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, bias-corrected moments: ``torch.optim.AdamW``'s update, made by torch's own
    fused kernel) with its moments in ``state_dtype`` and, when ``grad_dtype`` is bfloat16, the gradients moved off
    ``param.grad`` into bfloat16 buffers as soon as backward has accumulated them (a hook per parameter), so the
    float32 gradients of the whole model never exist at once. Those buffers (``grads``) are what ``step`` reads
    and ``zero_grad`` drops (kept from one step to the next they would be resident through the next forward pass,
    where the activations peak: +0.2 GB on SmolLM2). The hook also keeps each gradient's squared norm, taken in
    float32 before rounding, so ``grad_norm`` reads no buffer again, and ``clip_`` leaves its scale for ``step`` to
    apply to each slice it has in float32 anyway. A ``param.grad`` that is set (a state loader's zero step) is
    used too."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 state_dtype: torch.dtype = torch.bfloat16, grad_dtype: torch.dtype = torch.float32) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.state_dtype, self.grad_dtype = state_dtype, grad_dtype
        self.grads: dict[torch.nn.Parameter, torch.Tensor] = {}
        self._sq: dict[torch.nn.Parameter, float] = {}  # squared norm of each gradient in ``grads``
        self._scale = 1.0  # left by clip_ for step
        self._hooks = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype != torch.float32:
                    raise ValueError(f"LowMemoryAdamW trains float32 parameters, got {p.dtype}")
                if grad_dtype != torch.float32:
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._take_grad))

    @staticmethod
    def _process_value_according_to_param_policy(param, value, param_id, param_groups, key=None):  # noqa: ANN001, ANN205
        """Loading a state dict: torch casts every floating state to the parameter's dtype; the moments keep the
        dtype they were saved in (no float32 copy of them while loading) and ``load_state_dict`` sets ours."""
        if key in ("exp_avg", "exp_avg_sq"):
            return value.to(device=param.device)
        return torch.optim.Optimizer._process_value_according_to_param_policy(param, value, param_id, param_groups,
                                                                             key)

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        for st in self.state.values():  # a checkpoint saved with another state_dtype
            for key in ("exp_avg", "exp_avg_sq"):
                if key in st and st[key].dtype != self.state_dtype:
                    st[key] = st[key].to(self.state_dtype)

    @property
    def holds_grads(self) -> bool:
        """Whether gradients live in this optimizer's buffers rather than on ``param.grad``."""
        return self.grad_dtype != torch.float32

    @torch.no_grad()
    def _take_grad(self, p: torch.nn.Parameter) -> None:
        if p in self.grads:  # a later micro-batch: summed in float32, rounded once
            total = self.grads[p].float().add_(p.grad)
            self.grads[p].copy_(total)
        else:
            total = p.grad
            self.grads[p] = total.to(self.grad_dtype)
        # a Python float: 0-d tensors kept through backward sit among the freed activations in the heap and kept
        # ~0.1 GB of it from being handed back (SmolLM2's peak, benchmarks/rl/memory.py)
        self._sq[p] = float(torch.linalg.vector_norm(total)) ** 2
        p.grad = None

    def gradient(self, p: torch.nn.Parameter) -> torch.Tensor | None:
        """``p``'s gradient as held (before the scale ``clip_`` leaves for ``step``)."""
        return self.grads.get(p, p.grad)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.grads.clear()
        self._sq.clear()
        self._scale = 1.0
        super().zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def grad_norm(self) -> torch.Tensor:
        """The L2 norm over every gradient, in float32 (as held, before a pending clip)."""
        sq = torch.zeros((), dtype=torch.float32)
        for group in self.param_groups:
            for p in group["params"]:
                if p in self._sq:
                    sq += self._sq[p]
                elif (g := self.gradient(p)) is not None:
                    sq += torch.linalg.vector_norm(g, dtype=torch.float32).square()
        return sq.sqrt()

    @torch.no_grad()
    def clip_(self, max_norm: float) -> float:
        """Clip the global norm to at most ``max_norm``: ``step`` scales every gradient as it reads it (the
        contract of ``torch.nn.utils.clip_grad_norm_`` for the update; no pass of its own over the gradients).
        Returns the norm before; a non-finite norm scales nothing."""
        norm = float(self.grad_norm())
        self._scale = max_norm / (norm + 1e-6) if math.isfinite(norm) and norm > max_norm else 1.0
        return norm

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001, ANN201 (torch's signature)
        loss = closure() if closure is not None else None
        scale = self._scale
        bufs = [torch.empty(CHUNK, dtype=torch.float32) for _ in range(3)]  # gradient, moments: float32 slices
        stepped = []
        for group in self.param_groups:
            b1, b2 = group["betas"]
            hyper = {"lr": group["lr"], "beta1": b1, "beta2": b2, "weight_decay": group["weight_decay"],
                     "eps": group["eps"], "amsgrad": False, "maximize": False}
            for p in group["params"]:
                g = self.gradient(p)
                if g is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = torch.zeros((), dtype=torch.float32)
                    st["exp_avg"] = torch.zeros_like(p, dtype=self.state_dtype, memory_format=torch.preserve_format)
                    st["exp_avg_sq"] = torch.zeros_like(p, dtype=self.state_dtype,
                                                        memory_format=torch.preserve_format)
                st["step"] += 1
                steps = [st["step"]]
                pf, gf, mf, vf = (x.view(-1) for x in (p, g, st["exp_avg"], st["exp_avg_sq"]))
                for i in range(0, pf.numel(), CHUNK):
                    s = slice(i, i + CHUNK)
                    n = pf[s].numel()
                    gc, mc, vc = (x[s] if x.dtype == torch.float32 else b[:n].copy_(x[s])
                                  for x, b in zip((gf, mf, vf), bufs))
                    if scale != 1.0:
                        gc = (gc if gc.data_ptr() != gf[s].data_ptr() else bufs[0][:n].copy_(gc)).mul_(scale)
                    # torch.optim.AdamW(fused=True)'s own kernel, on float32 slices that stay in the CPU's cache
                    torch._fused_adamw_([pf[s]], [gc], [mc], [vc], [], steps, **hyper)
                    if mc.data_ptr() != mf[s].data_ptr():
                        mf[s].copy_(mc)
                        vf[s].copy_(vc)
                stepped.append(p)
        mark_updated(stepped)
        return loss


def build_optimizer(params: Iterable[torch.nn.Parameter], lr: float, betas: tuple[float, float],
                    weight_decay: float, state_dtype: str = "float32", grad_dtype: str = "float32",
                    sharded: bool = False, world: int = 1, fused: bool = True) -> torch.optim.Optimizer:
    """AdamW (see the module docstring). ``sharded``: FSDP2's DTensor parameters, which only torch's AdamW steps
    (bfloat16 moments or gradients are refused there with a clear error); ``world``: trainer processes (bfloat16
    gradients, held off ``param.grad``, are refused with more than one); ``fused``: torch's fused kernel where the
    parameters allow it (float32 on CPU or CUDA), else torch's own choice of implementation."""
    if grad_dtype != "float32" and world > 1:
        raise ValueError("optim.grad_dtype = 'bfloat16' holds the gradients outside the parameters, where the "
                         "ranks' all-reduce does not see them: use it with one trainer process")
    params = list(params)
    if state_dtype == "float32" and grad_dtype == "float32":
        fused = fused and all(p.device.type in ("cpu", "cuda") and p.dtype == torch.float32 for p in params)
        opt = torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused or None)
        if fused:
            opt.register_step_post_hook(
                lambda o, _args, _kwargs: mark_updated([p for g in o.param_groups for p in g["params"]]))
        return opt
    if sharded:
        raise ValueError("optim.state_dtype / optim.grad_dtype bfloat16 is for one whole copy of the model: "
                         "under trainer.parallel = 'fsdp2' the optimizer state is already sharded; use float32")
    return LowMemoryAdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, state_dtype=DTYPES[state_dtype],
                          grad_dtype=DTYPES[grad_dtype])


def mark_updated(params: list[torch.nn.Parameter]) -> None:
    """Count a fused step as an in-place change of ``params``. The fused AdamW kernel writes the weights without
    bumping their version counters (torch 2.13), and what caches work derived from the weights keys it on them:
    the static decoder's weight copies (``swarmrl.inference.static_decoder``) would otherwise sample the trainer's
    in-process evaluations from the weights before the first step. ``LowMemoryAdamW.step`` calls it; torch's
    fused AdamW gets it as a step hook from ``build_optimizer``."""
    torch.autograd.graph.increment_version(params)


def clip_gradients(parameters: Iterable[torch.nn.Parameter], opt: torch.optim.Optimizer, max_norm: float) -> float:
    """Clip the global gradient norm to ``max_norm`` wherever the gradients are held; returns the norm before."""
    if isinstance(opt, LowMemoryAdamW) and opt.holds_grads:
        return opt.clip_(max_norm)
    return float(torch.nn.utils.clip_grad_norm_(parameters, max_norm))
