"""A group's prompt computed once: the completions of one prompt packed into one row behind it.

GRPO samples ``group_size`` completions of each prompt, and ``pack`` lays each out as prompt + completion, so the
decoder runs over the prompt ``group_size`` times. Under causal attention a prompt's hidden states do not depend on
what follows it, so that is the same computation repeated. ``pack_shared`` lays a group out as ONE row,
``prompt + c1 + c2 + ... + cn``, with

- position ids that restart each completion where the prompt ends (``p, p+1, ...``), and
- an attention mask in which a completion's token sees the whole prompt and its own earlier tokens, never another
  completion's,

so every token sees exactly what it sees in its own sequence, at the same position: the same logprobs, the same
gradients (within float32 rounding), from ``p + sum(c_i)`` tokens instead of ``n * p + sum(c_i)``. With 48-token
prompts and 8 completions of 16 tokens that is 176 tokens in place of 512.

The first completion token of every member is predicted from the prompt's last position, shared by the n members;
token t >= 1 from the member's own token t-1. ``shared_logprobs`` gathers those positions' hidden states and runs the
LM head over them as ``sequence_logprobs`` does (``packing.head_logprobs``). Outputs use the *completion layout*:
[n_sequences, longest completion], token t of sequence i at [i, t]; ``cmask``/``old`` of ``pack_shared`` match.

It needs a model that takes a custom 4D attention mask and position ids (HF decoders with the ``sdpa`` or ``eager``
attention) and a plain LM head; ``supports_shared`` says whether a model qualifies, and the caller takes the plain
path otherwise. The mask is [rows, W, W] (boolean for sdpa, as HF builds its own from a 2D mask; additive for eager),
so a row is bounded: past ``MAX_ROW_TOKENS`` a group's next members go to another row behind the same prompt, and
long completions cost no more mask or attention than one sequence per row.
"""

from __future__ import annotations

import torch

from swarmrl.rollouts.packing import Sequence, _plain_head, head_logprobs

__all__ = ["pack_shared", "shared_logprobs", "supports_shared"]

_MASKABLE = ("sdpa", "eager")  # attention implementations that apply an arbitrary additive 4D mask


def supports_shared(model) -> bool:  # noqa: ANN001
    """A plain LM head on a decoder whose attention takes a custom 4D mask, every layer attending to all earlier
    tokens (a custom mask replaces the sliding window HF would build, so windowed models take the plain path)."""
    cfg = getattr(model, "config", None)
    impl = getattr(cfg, "_attn_implementation", None)
    layer_types = getattr(cfg, "layer_types", None) or []
    windowed = any(t != "full_attention" for t in layer_types) or (
        getattr(cfg, "sliding_window", None) is not None and getattr(cfg, "use_sliding_window", True) is not False)
    return _plain_head(model) is not None and impl in _MASKABLE and not windowed


MAX_ROW_TOKENS = 1024  # a row's width beyond which a group's members continue in another row behind its prompt


def _rows(seqs: list[Sequence], max_row_tokens: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, members) per row: members of one prompt in order, a new row behind the same prompt whenever the
    next member would take the row past ``max_row_tokens`` (a row always takes one member), so the [W, W] mask and
    the attention's work stay bounded however long or many the completions."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, s in enumerate(seqs):
        if not s.prompt_ids:
            raise ValueError("a sequence without a prompt has no position to predict its first token from")
        groups.setdefault(tuple(s.prompt_ids), []).append(i)
    rows: list[tuple[list[int], list[int]]] = []
    for prompt, members in groups.items():
        width, cur = len(prompt), []
        for i in members:
            c = len(seqs[i].completion_ids)
            if cur and width + c > max_row_tokens:
                rows.append((list(prompt), cur))
                width, cur = len(prompt), []
            cur.append(i)
            width += c
        rows.append((list(prompt), cur))
    return rows


def pack_shared(seqs: list[Sequence], pad_id: int, max_row_tokens: int = MAX_ROW_TOKENS) -> dict[str, torch.Tensor]:
    """Rows of prompt groups (members with identical prompts, in order of first appearance; more than one row per
    prompt past ``max_row_tokens``) and where each scored token's prediction sits in them.

    Returns ``ids``/``pos`` [R, W] (token and position ids), ``allowed`` [R, W, W] (bool: query may attend key),
    ``row``/``at``/``target`` [N] (the row and position predicting each scored token, and the token), ``flat`` [N]
    (where each lands in the completion layout, flattened), and in the completion layout [n, C]: ``cmask`` (1 where
    the token is the model's: scored) and ``old`` (the rows' logprobs there)."""
    if not seqs:
        raise ValueError("pack_shared needs at least one sequence")
    layout = _rows(seqs, max_row_tokens)
    widths = [len(p) + sum(len(seqs[i].completion_ids) for i in members) for p, members in layout]
    r_n, w = len(layout), max(widths)
    c_max = max(1, max(len(s.completion_ids) for s in seqs))
    ids = torch.full((r_n, w), pad_id, dtype=torch.long)
    pos = torch.zeros((r_n, w), dtype=torch.long)
    allowed = torch.zeros((r_n, w, w), dtype=torch.bool)
    cmask = torch.zeros((len(seqs), c_max), dtype=torch.float32)
    old = torch.zeros((len(seqs), c_max), dtype=torch.float32)
    rows, ats, targets = [], [], []
    scored: list[tuple[int, int]] = []  # (sequence, token) of each scored entry, in the order gathered
    for r, (prompt, members) in enumerate(layout):
        p = len(prompt)
        ids[r, :p] = torch.tensor(prompt)
        pos[r, :p] = torch.arange(p)
        allowed[r, :p, :p] = torch.ones(p, p, dtype=torch.bool).tril()
        off = p
        for i in members:
            s = seqs[i]
            c = len(s.completion_ids)
            mlist = [1] * c if s.mask is None else [1 if x else 0 for x in s.mask]
            m = torch.tensor(mlist, dtype=torch.float32)
            cmask[i, :c] = m
            old[i, :c] = torch.tensor(s.logprobs, dtype=torch.float32) * m
            if c:
                ids[r, off: off + c] = torch.tensor(s.completion_ids)
                pos[r, off: off + c] = torch.arange(p, p + c)
                allowed[r, off: off + c, :p] = True
                allowed[r, off: off + c, off: off + c] = torch.ones(c, c, dtype=torch.bool).tril()
            for t in range(c):
                if mlist[t]:
                    rows.append(r)
                    ats.append(p - 1 if t == 0 else off + t - 1)
                    targets.append(s.completion_ids[t])
                    scored.append((i, t))
            off += c
        allowed[r, off:, off:] = torch.eye(w - off, dtype=torch.bool)  # padding sees itself: no empty softmax row
    flat = torch.tensor([i * c_max + t for i, t in scored], dtype=torch.long)
    return {"ids": ids, "pos": pos, "allowed": allowed, "row": torch.tensor(rows, dtype=torch.long),
            "at": torch.tensor(ats, dtype=torch.long), "target": torch.tensor(targets, dtype=torch.long),
            "flat": flat, "cmask": cmask, "old": old}


def shared_logprobs(model, packed: dict[str, torch.Tensor], temperature: float, with_entropy: bool = False,
                    entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs (and entropies) of the scored tokens of ``pack_shared``'s rows, in the completion layout [n, C]
    (0 where ``cmask`` is 0), as ``sequence_logprobs`` computes them from one sequence per row."""
    if not supports_shared(model):
        raise ValueError("shared_logprobs needs a plain LM head and sdpa or eager attention (supports_shared)")
    head = _plain_head(model)
    if model.config._attn_implementation == "sdpa":
        mask = packed["allowed"][:, None]  # boolean: True attends
    else:  # eager adds the mask to the scores
        dtype = head.weight.dtype
        mask = torch.zeros(packed["allowed"].shape, dtype=dtype).masked_fill_(~packed["allowed"],
                                                                             torch.finfo(dtype).min)[:, None]
    hidden = model.get_decoder()(input_ids=packed["ids"], position_ids=packed["pos"],
                                 attention_mask=mask).last_hidden_state
    h = hidden[packed["row"], packed["at"]]
    logp, ent = head_logprobs(head, h, packed["target"], temperature, with_entropy, entropy_grad)
    shape = packed["cmask"].shape
    out = torch.zeros(shape[0] * shape[1], dtype=torch.float32, device=h.device)
    logp_full = out.index_put((packed["flat"],), logp).view(shape)
    ent_full = out.index_put((packed["flat"],), ent).view(shape) if ent is not None else None
    return logp_full, ent_full
