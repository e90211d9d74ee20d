"""The sampler's fast path: a static-KV-cache decoder for Llama / Qwen2-architecture HF models.

It runs the same computation as the HF modules (RMSNorm in fp32, rotary embeddings from the model's own rotary
module, SDPA attention, SiLU-gated MLP, residuals; nothing approximated) with less overhead per token:

- one preallocated key/value cache per layer, ``[rows, kv_heads, slots, head_dim]``, written in place (no
  per-step concatenation); prompts are left-aligned at slot ``width - len(prompt)`` so every row's next token goes
  to the same slot, and a boolean ``valid`` mask says which slots a row may attend to;
- prefill without padding: the prompts are packed into sequences of at most ``PREFILL_TOKENS`` tokens, each with a
  block-diagonal causal mask, so no work is spent on pad tokens;
- the projections as 2-D products against one-time copies of the weights (q/k/v and gate/up fused): on CPU in
  oneDNN's blocked layout (``_Proj``), 1.5-3.3x faster than ``F.linear`` for decode-sized batches here. The copies are
  cached per model and rebuilt when any parameter changes (in-place updates bump ``Tensor._version``): one extra
  copy of the weights in memory while a model is in use (``borrowed_weights``: none, for a model being trained);
- decode attention treats the query heads that share a key/value head as that head's queries
  (``[rows, kv_heads, group, head_dim]``), so grouped-query attention needs no repeated keys;
- rows can be dropped from the batch (``keep``) once they are finished.

``unsupported_reason(model)`` says why a model cannot take this path (the sampler then uses HF's forward).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812

SUPPORTED_TYPES = ("llama", "qwen2")
STATIC_ROPE = ("default", "linear", "llama3")  # rotary tables that depend on the position only
PREFILL_TOKENS = 1024  # packed prefill: at most this many prompt tokens per forward (a longer prompt goes alone)


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """None when ``model`` can run on the static decoder, else why not."""
    cfg = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if cfg is None or inner is None or getattr(cfg, "model_type", None) not in SUPPORTED_TYPES:
        return f"model type {getattr(cfg, 'model_type', None)!r} is not one of {SUPPORTED_TYPES}"
    for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(inner, name):
            return f"model.model has no {name}"
    if getattr(model, "lm_head", None) is None or model.get_output_embeddings() is not model.lm_head:
        return "the LM head is not model.lm_head"
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "pretraining_tp", 1) != 1:
        return "activation or tensor-parallel layout differs from Llama's"
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return "sliding-window layers"
    if getattr(inner.rotary_emb, "rope_type", "default") not in STATIC_ROPE:
        return f"rope type {inner.rotary_emb.rope_type!r} is not position-only"
    if model.training and getattr(cfg, "attention_dropout", 0.0):
        return "attention dropout in training mode"
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "attn_logit_softcapping", None):
        return "logit soft-capping"
    if any(p.device != model.lm_head.weight.device for p in model.parameters()):
        return "parameters on more than one device"
    for layer in inner.layers:
        a, m = layer.self_attn, layer.mlp
        if any((p.bias is None) != (a.q_proj.bias is None) for p in (a.k_proj, a.v_proj)) or \
                (m.gate_proj.bias is None) != (m.up_proj.bias is None):
            return "biases on only some of the fused projections"
    return None


# oneDNN's layout pays off once the weights stream from memory; a model this small (weights in the caches) is a bit
# faster with plain torch.mm (measured: SmolLM2-135M 6.65 s vs 8.38 s for 1024 tokens; the 4.3M tiny 0.37 vs 0.34 s)
ONEDNN_MIN_PARAMS = 16_000_000


def _onednn_ok(model: torch.nn.Module) -> bool:
    w = model.lm_head.weight
    return (sum(p.numel() for p in model.parameters()) >= ONEDNN_MIN_PARAMS and w.device.type == "cpu"
            and w.dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def applied_weight(m: torch.nn.Module) -> torch.Tensor:
    """The weight a linear layer's forward applies: its own, or for a peft LoRA layer (a model the trainer trains
    as an adapter) the base's plus each active adapter's ``B @ A * alpha / r``, unless merged into the base or
    switched off. (Its ``.weight`` is the base's alone: copying that sampled the base, not the policy.)"""
    if not hasattr(m, "get_delta_weight") or not hasattr(m, "base_layer"):
        return m.weight.detach()
    w = m.base_layer.weight.detach()
    if getattr(m, "merged", False) or getattr(m, "disable_adapters", False):
        return w
    with torch.no_grad():
        for name in m.active_adapters:
            if name in m.lora_A:
                w = w + m.get_delta_weight(name).to(w.dtype)
    return w


def _adapter_state(model: torch.nn.Module) -> tuple:
    """Whether each LoRA layer's adapters are on and merged (switching them changes no parameter's version)."""
    return tuple((bool(getattr(m, "merged", False)), bool(getattr(m, "disable_adapters", False)),
                  tuple(getattr(m, "active_adapters", ()))) for m in model.modules() if hasattr(m, "get_delta_weight"))


class _Proj:
    """``x @ cat(weights).T + cat(biases)`` for 2-D ``x``: one product for several projections of the same input.

    With ``onednn`` (CPU, fp32) the weight is copied once into oneDNN's blocked layout: at one thread a
    [16, 576] x [576, 49152] product took 17.1 ms against 25.7 ms for ``F.linear`` (8 rows: 14.3 vs 36.4 ms; MKL's
    plain GEMM is slow for row counts that are not a multiple of 16; ``benchmarks/inference/parts.py``). Otherwise: a transposed contiguous copy and
    ``torch.mm`` (``x @ W_t``, faster than ``F.linear``'s ``x @ W.T`` for these shapes)."""

    def __init__(self, mods: list[torch.nn.Module], onednn: bool, borrow: bool = False) -> None:
        self.parts: list[tuple[torch.Tensor, torch.Tensor | None]] | None = None
        if borrow:  # the modules' own weights, no copy: one F.linear per projection
            self.parts = [(applied_weight(m), None if m.bias is None else m.bias.detach()) for m in mods]
            self.out = sum(w.shape[0] for w, _ in self.parts)
            return
        w = torch.cat([applied_weight(m) for m in mods]) if len(mods) > 1 else applied_weight(mods[0])
        b = None if getattr(mods[0], "bias", None) is None else torch.cat([m.bias.detach() for m in mods])
        self.out = w.shape[0]
        self.onednn = onednn
        self.b = b
        self.w = torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), 16) if self.onednn else w.t().contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.parts is not None:
            outs = [F.linear(x, w, b) for w, b in self.parts]
            return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        if self.onednn:
            return torch.ops.mkldnn._linear_pointwise(x, self.w, self.b, "none", [], "")
        return torch.mm(x, self.w) if self.b is None else torch.addmm(self.b, x, self.w)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's LlamaRMSNorm / Qwen2RMSNorm: normalise in fp32, scale in the input dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@dataclass(frozen=True)
class _Layer:
    ln1: torch.Tensor
    eps1: float
    qkv: _Proj  # q, k, v in one product
    o: _Proj
    ln2: torch.Tensor
    eps2: float
    gate_up: _Proj  # gate, up in one product
    down: _Proj


@dataclass
class KVCache:
    k: list[torch.Tensor]  # per layer [rows, kv_heads, slots, head_dim]
    v: list[torch.Tensor]
    valid: torch.Tensor  # [rows, slots] bool: slots a row attends to

    def keep(self, idx: torch.Tensor) -> None:
        """Keep only rows ``idx`` (in that order)."""
        self.k = [c.index_select(0, idx) for c in self.k]
        self.v = [c.index_select(0, idx) for c in self.v]
        self.valid = self.valid.index_select(0, idx)


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _signature(model: torch.nn.Module) -> tuple:
    return tuple((p.data_ptr(), p._version, p.dtype) for p in model.parameters()) + _adapter_state(model)


_BORROWED: weakref.WeakSet = weakref.WeakSet()


@contextmanager
def borrowed_weights(model: torch.nn.Module) -> Iterator[None]:
    """Inside, ``model`` samples on its own weights: no copy in the decoder's layout (about the size of the weights
    again), at some speed (``_Proj``: one ``F.linear`` per projection). For a model that changes between samplings
    (one being trained, evaluated between steps) the copies would be rebuilt each time and held in between: the
    trainer's memory peak. Copies made for it before are dropped on entry, and nothing is kept after."""
    _CACHE.pop(model, None)
    _BORROWED.add(model)
    try:
        yield
    finally:
        _BORROWED.discard(model)
        _CACHE.pop(model, None)


class StaticDecoder:
    """Prefill and one-token decode steps for a supported model (check ``unsupported_reason`` first)."""

    def __init__(self, model: torch.nn.Module, borrow: bool = False) -> None:
        cfg, inner = model.config, model.model
        attn0 = inner.layers[0].self_attn
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = attn0.head_dim
        self.scaling = float(attn0.scaling)
        self.embed = inner.embed_tokens.weight.detach()
        self.rotary = inner.rotary_emb
        self.norm = inner.norm.weight.detach()
        self.norm_eps = float(inner.norm.variance_epsilon)
        one = _onednn_ok(model) and not borrow

        def proj(mods: list[torch.nn.Module]) -> _Proj:
            return _Proj(mods, one, borrow)

        self.head = proj([model.lm_head])
        self.layers: list[_Layer] = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append(_Layer(
                ln1=layer.input_layernorm.weight.detach(), eps1=float(layer.input_layernorm.variance_epsilon),
                qkv=proj([a.q_proj, a.k_proj, a.v_proj]), o=proj([a.o_proj]),
                ln2=layer.post_attention_layernorm.weight.detach(),
                eps2=float(layer.post_attention_layernorm.variance_epsilon),
                gate_up=proj([m.gate_proj, m.up_proj]), down=proj([m.down_proj])))
        self.dtype = self.embed.dtype
        self.device = self.embed.device
        self.hidden = self.embed.shape[1]

    @classmethod
    def for_model(cls, model: torch.nn.Module) -> StaticDecoder:
        """The decoder for ``model``, reusing the weight copies made for it while its parameters are unchanged."""
        sig = _signature(model)
        hit = _CACHE.get(model)
        if hit is not None and hit[0] == sig:
            return hit[1]
        _CACHE.pop(model, None)  # drop the stale copies before making new ones
        dec = cls(model, borrow=model in _BORROWED)
        _CACHE[model] = (sig, dec)
        return dec

    def rope_table(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[n, head_dim]`` for positions 0..n-1, from the model's own rotary module."""
        probe = torch.empty(0, dtype=self.dtype, device=self.device)
        cos, sin = self.rotary(probe, torch.arange(n, device=self.device)[None])
        return cos[0], sin[0]

    def new_cache(self, rows: int, slots: int) -> KVCache:
        shape = (rows, self.kv_heads, slots, self.head_dim)
        kw = dict(dtype=self.dtype, device=self.device)
        # zeros, not empty: pad slots are never written, and a masked-out NaN value would still poison the output
        return KVCache([torch.zeros(shape, **kw) for _ in self.layers], [torch.zeros(shape, **kw) for _ in self.layers],
                       torch.zeros((rows, slots), dtype=torch.bool, device=self.device))

    def _mlp(self, h: torch.Tensor, ly: _Layer) -> torch.Tensor:
        gu = ly.gate_up(_rms(h, ly.ln2, ly.eps2))
        inter = ly.gate_up.out // 2
        return h + ly.down(F.silu(gu[:, :inter]) * gu[:, inter:])

    def _out(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hn = _rms(h, self.norm, self.norm_eps)
        return self.head(hn), hn

    def prefill(self, prompts: list[list[int]], cache: KVCache, width: int, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the prompts (row i's tokens go to slots ``width - len(p) .. width - 1``); the logits and final-norm
        states at each prompt's last token, ``[rows, vocab]`` and ``[rows, hidden]``."""
        logits: list[torch.Tensor | None] = [None] * len(prompts)
        hidden: list[torch.Tensor | None] = [None] * len(prompts)
        start = 0
        while start < len(prompts):
            end, n = start + 1, len(prompts[start])
            while end < len(prompts) and n + len(prompts[end]) <= PREFILL_TOKENS:
                n += len(prompts[end])
                end += 1
            lg, hn = self._prefill_chunk(prompts[start:end], start, cache, width, cos, sin)
            for j in range(end - start):
                logits[start + j], hidden[start + j] = lg[j], hn[j]
            start = end
        cache.valid[:, :width] = torch.arange(width, device=self.device)[None] >= (
            width - torch.tensor([len(p) for p in prompts], device=self.device))[:, None]
        return torch.stack(logits), torch.stack(hidden)

    def _prefill_chunk(self, prompts: list[list[int]], row0: int, cache: KVCache, width: int, cos: torch.Tensor,
                       sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dev = self.device
        lens = torch.tensor([len(p) for p in prompts], device=dev)
        ids = torch.tensor([t for p in prompts for t in p], dtype=torch.long, device=dev)
        seg = torch.repeat_interleave(torch.arange(len(prompts), device=dev), lens)
        ends = lens.cumsum(0)
        pos = torch.arange(ids.shape[0], device=dev) - (ends - lens)[seg]
        rows, slots = seg + row0, pos + (width - lens)[seg]
        mask = (seg[:, None] == seg[None, :]) & (pos[:, None] >= pos[None, :])
        n, d, nq, nk = ids.shape[0], self.head_dim, self.heads * self.head_dim, self.kv_heads * self.head_dim
        c, s = cos[pos][None, None], sin[pos][None, None]  # [1, 1, n, d]
        rep = self.heads // self.kv_heads
        h = self.embed[ids]
        for i, ly in enumerate(self.layers):
            qkv = ly.qkv(_rms(h, ly.ln1, ly.eps1))
            q = _rope(qkv[:, :nq].view(n, self.heads, d).transpose(0, 1)[None], c, s)
            k = _rope(qkv[:, nq:nq + nk].view(n, self.kv_heads, d).transpose(0, 1)[None], c, s)
            v = qkv[:, nq + nk:].view(n, self.kv_heads, d).transpose(0, 1)[None]
            cache.k[i][rows, :, slots] = k[0].transpose(0, 1)
            cache.v[i][rows, :, slots] = v[0].transpose(0, 1)
            if rep > 1:
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None], scale=self.scaling)
            h = h + ly.o(a[0].transpose(0, 1).reshape(n, nq))
            h = self._mlp(h, ly)
        return self._out(h[ends - 1])

    def step(self, tok: torch.Tensor, pos: torch.Tensor, slot: int, cache: KVCache, cos: torch.Tensor,
             sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed one token per row (row i at position ``pos[i]``, all into cache slot ``slot``); the next logits and
        final-norm states, ``[rows, vocab]`` and ``[rows, hidden]``."""
        b, d, nq, nk = tok.shape[0], self.head_dim, self.heads * self.head_dim, self.kv_heads * self.head_dim
        group = self.heads // self.kv_heads
        cache.valid[:, slot] = True
        mask = cache.valid[:, None, None, :slot + 1]
        c, s = cos[pos][:, None, None], sin[pos][:, None, None]  # [b, 1, 1, d]
        h = self.embed[tok]
        for i, ly in enumerate(self.layers):
            qkv = ly.qkv(_rms(h, ly.ln1, ly.eps1))
            q = _rope(qkv[:, :nq].view(b, self.kv_heads, group, d), c, s)  # a kv head's query heads as its queries
            cache.k[i][:, :, slot] = _rope(qkv[:, nq:nq + nk].view(b, self.kv_heads, 1, d), c, s)[:, :, 0]
            cache.v[i][:, :, slot] = qkv[:, nq + nk:].view(b, self.kv_heads, d)
            a = F.scaled_dot_product_attention(q, cache.k[i][:, :, :slot + 1], cache.v[i][:, :, :slot + 1],
                                               attn_mask=mask, scale=self.scaling)
            h = h + ly.o(a.reshape(b, nq))
            h = self._mlp(h, ly)
        return self._out(h)
