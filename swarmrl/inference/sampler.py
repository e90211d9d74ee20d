"""Batched autoregressive sampling with a KV cache.

Prompts are left-padded; position ids come from the attention-mask cumsum so padded rows see the
same positions as an unpadded prefill. For every generated token we keep

- its logprob under the sampling distribution (logits / temperature, before top-p), which the
  trainer uses as the behaviour policy in the importance ratio;
- optionally the final-norm hidden state that produced it (the LM head's input), captured by a
  hook during sampling (no second forward pass) for TOPLOC proofs. The state for completion
  token i is the one at sequence position len(prompt) - 1 + i, which is exactly what a verifier's
  single prefill over prompt + completion yields at that position.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from swarmrl.inference.params import SamplingParams
from swarmrl.inference.static_decoder import StaticDecoder, unsupported_reason


@dataclass
class SampleOutput:
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]  # generated tokens, EOS included when produced
    logprobs: list[list[float]]  # one per completion token
    finished: list[bool]  # True when the completion ended with EOS
    hidden: list[torch.Tensor] | None = field(default=None)  # [len(completion), hidden] bf16 each


class _LMHeadInputHook:
    """Captures the input of the LM head (= the final-norm hidden state)."""

    def __init__(self, model: torch.nn.Module) -> None:
        head = model.get_output_embeddings()
        if head is None:
            raise ValueError("model has no output embeddings (LM head) to hook")
        self.last: torch.Tensor | None = None
        self._h = head.register_forward_pre_hook(self._hook)

    def _hook(self, _mod: torch.nn.Module, args: tuple) -> None:
        self.last = args[0].detach()

    def close(self) -> None:
        self._h.remove()


def _left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError("empty prompt")
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids, mask


def _race(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """One categorical draw per row from that row's own generator: argmax(p / E), E ~ Exp(1) (exponential race)."""
    q = torch.empty_like(probs)
    for i, g in enumerate(generators):
        q[i].exponential_(generator=g)
    return (probs / q).argmax(dim=-1)


def _pick(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
          row_generators: list[torch.Generator] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens and their logprobs under logits / temperature (greedy: temperature 1 logprobs). With
    ``row_generators`` row i draws from its own generator (a request's tokens depend on its seed, not its batch)."""
    logits = logits.float()
    if params.temperature == 0.0:
        logp = torch.log_softmax(logits, dim=-1)
        tok = logp.argmax(dim=-1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
    logp = torch.log_softmax(logits / params.temperature, dim=-1)
    probs = logp.exp()
    if row_generators is not None:
        if params.top_p < 1.0:
            sp, si = probs.sort(dim=-1, descending=True)
            sp = sp * ((sp.cumsum(-1) - sp) < params.top_p)
            tok = si.gather(-1, _race(sp, row_generators)[:, None]).squeeze(-1)
        else:
            tok = _race(probs, row_generators)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
    if params.top_p < 1.0:
        sp, si = probs.sort(dim=-1, descending=True)
        keep = (sp.cumsum(-1) - sp) < params.top_p  # always keeps the top token
        sp = sp * keep
        choice = torch.multinomial(sp / sp.sum(-1, keepdim=True), 1, generator=generator).squeeze(-1)
        tok = si.gather(-1, choice[:, None]).squeeze(-1)
    else:
        tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def generate(model: torch.nn.Module, prompts: list[list[int]], params: SamplingParams, eos_id: int, pad_id: int,
             capture_hidden: bool = False, generator: torch.Generator | None = None,
             generators: list[torch.Generator] | None = None, share_prompts: bool = True) -> SampleOutput:
    """Sample one completion per prompt (repeat a prompt to get a group). Randomness: ``generators`` (one per
    prompt, each request its own stream), else ``generator`` (one stream for the batch), else torch's global one.
    Llama / Qwen2 models run on the static-cache decoder (``static_decoder``), others on HF's forward.
    ``share_prompts=False`` prefills every row, repeated prompts too (the same numbers, more work: a baseline)."""
    if generators is not None and len(generators) != len(prompts):
        raise ValueError(f"{len(generators)} generators for {len(prompts)} prompts")
    if not prompts:
        return SampleOutput([], [], [], [], [] if capture_hidden else None)
    if any(len(p) == 0 for p in prompts):
        raise ValueError("empty prompt")
    prompts = [list(p) for p in prompts]
    with torch.inference_mode():
        if unsupported_reason(model) is None:
            toks, lps, hid = _sample_static(model, prompts, params, eos_id, pad_id, capture_hidden, generator,
                                            generators, share_prompts)
        else:
            toks, lps, hid = _sample_hf(model, prompts, params, eos_id, pad_id, capture_hidden, generator,
                                        generators)
    return _output(prompts, toks, lps, hid, eos_id)


def _output(prompts: list[list[int]], toks: torch.Tensor, lps: torch.Tensor, hid: torch.Tensor | None,
            eos_id: int) -> SampleOutput:
    """Cut each row after its first EOS (kept) and convert to lists in one pass."""
    steps = toks.shape[1]
    is_eos = toks == eos_id
    lengths = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, steps).tolist()
    tok_rows, lp_rows = toks.tolist(), lps.tolist()
    comp = [r[:n] for r, n in zip(tok_rows, lengths)]
    logps = [r[:n] for r, n in zip(lp_rows, lengths)]
    fin = [n > 0 and c[-1] == eos_id for c, n in zip(comp, lengths)]
    hidden = [hid[i, :n].clone() for i, n in enumerate(lengths)] if hid is not None else None
    return SampleOutput(prompts, comp, logps, fin, hidden)


def _stop_check_every(device: torch.device) -> int:
    """How often finished rows are looked for (a host sync): every step on CPU, where it costs nothing."""
    return 1 if device.type == "cpu" else 8


def _sample_static(model: torch.nn.Module, prompts: list[list[int]], params: SamplingParams, eos_id: int,
                   pad_id: int, capture_hidden: bool, generator: torch.Generator | None,
                   generators: list[torch.Generator] | None, share_prompts: bool = True,
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Tokens ``[rows, max_new_tokens]`` (pad after a row stops), their logprobs and (optionally) bf16 final-norm
    states, from the static-cache decoder. Rows are dropped from the batch once enough of them are finished."""
    dec = StaticDecoder.for_model(model)
    dev, steps, bsz = dec.device, params.max_new_tokens, len(prompts)
    width = max(len(p) for p in prompts)
    cos, sin = dec.rope_table(width + steps)
    # a group's rows share their prompt: each distinct prompt is prefilled once and its cache rows, last logits and
    # state are copied to the rows that repeat it (the same numbers a prefill of every row computes, less work)
    first: dict[tuple[int, ...], int] = {}
    which = [first.setdefault(tuple(p), len(first)) for p in prompts]
    if share_prompts and len(first) < bsz:
        cache = dec.new_cache(len(first), width + steps)
        logits, hn = dec.prefill([list(p) for p in first], cache, width, cos, sin)
        expand = torch.tensor(which, device=dev)
        cache.keep(expand)
        logits, hn = logits.index_select(0, expand), hn.index_select(0, expand)
    else:
        cache = dec.new_cache(bsz, width + steps)
        logits, hn = dec.prefill(prompts, cache, width, cos, sin)
    out_tok = torch.full((bsz, steps), pad_id, dtype=torch.long, device=dev)
    out_lp = torch.zeros((bsz, steps), dtype=torch.float32, device=dev)
    out_h = torch.empty((bsz, steps, dec.hidden), dtype=torch.bfloat16, device=dev) if capture_hidden else None
    rows = torch.arange(bsz, device=dev)  # original index of each row still in the batch
    pos = torch.tensor([len(p) for p in prompts], device=dev)  # next position of each row
    done = torch.zeros(bsz, dtype=torch.bool, device=dev)  # per row still in the batch: produced EOS
    gens = list(generators) if generators is not None else None
    every = _stop_check_every(dev)
    for t in range(steps):
        tok, lp = _pick(logits, params, generator, gens)
        out_tok[rows, t] = tok
        out_lp[rows, t] = lp.float()
        if out_h is not None:
            out_h[rows, t] = hn.to(torch.bfloat16)
        if t == steps - 1:
            break
        if eos_id >= 0:
            done |= tok == eos_id
            if (t + 1) % every == 0:
                n_done = int(done.sum())
                if n_done == done.shape[0]:
                    break
                if n_done and n_done >= done.shape[0] // 8:  # drop finished rows (copies the cache: not for one of many)
                    keep = (~done).nonzero().squeeze(1)
                    cache.keep(keep)
                    rows, pos, tok, done = rows[keep], pos[keep], tok[keep], done[keep]
                    if gens is not None:
                        gens = [gens[i] for i in keep.tolist()]
        logits, hn = dec.step(tok, pos, width + t, cache, cos, sin)
        pos = pos + 1
    return out_tok.cpu(), out_lp.cpu(), out_h.cpu() if out_h is not None else None


def _sample_hf(model: torch.nn.Module, prompts: list[list[int]], params: SamplingParams, eos_id: int, pad_id: int,
               capture_hidden: bool, generator: torch.Generator | None,
               generators: list[torch.Generator] | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The same through HF's forward and its dynamic cache (models the static decoder does not cover)."""
    device = next(model.parameters()).device
    ids, mask = _left_pad(prompts, pad_id)
    ids, mask = ids.to(device), mask.to(device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    bsz = ids.shape[0]
    hook = _LMHeadInputHook(model) if capture_hidden else None
    out_tok: list[torch.Tensor] = []
    out_lp: list[torch.Tensor] = []
    out_h: list[torch.Tensor] = []
    done = torch.zeros(bsz, dtype=torch.bool, device=device)
    try:
        res = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        cache = res.past_key_values
        next_pos = pos[:, -1:] + 1
        for _step in range(params.max_new_tokens):
            if hook is not None:
                out_h.append(hook.last[:, -1, :].to(torch.bfloat16))
            tok, lp = _pick(res.logits[:, -1, :], params, generator, generators)
            tok = torch.where(done, torch.full_like(tok, pad_id), tok)
            out_tok.append(tok)
            out_lp.append(lp)
            done = done | (tok == eos_id)
            if bool(done.all()) or _step == params.max_new_tokens - 1:
                break
            mask = torch.cat([mask, torch.ones((bsz, 1), dtype=mask.dtype, device=device)], dim=1)
            res = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos, past_key_values=cache,
                        use_cache=True)
            cache = res.past_key_values
            next_pos = next_pos + 1
    finally:
        if hook is not None:
            hook.close()
    toks = torch.stack(out_tok, dim=1).cpu()
    lps = torch.stack(out_lp, dim=1).float().cpu()
    hid = torch.stack(out_h, dim=1).cpu() if hook is not None else None
    return toks, lps, hid
