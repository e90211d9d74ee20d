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


@torch.no_grad()
def generate(model: torch.nn.Module, prompts: list[list[int]], params: SamplingParams, eos_id: int, pad_id: int,
             capture_hidden: bool = False, generator: torch.Generator | None = None,
             generators: list[torch.Generator] | None = None) -> SampleOutput:
    """Sample one completion per prompt (repeat a prompt to get a group). Randomness: ``generators`` (one per
    prompt, each request its own stream), else ``generator`` (one stream for the batch), else torch's global one."""
    if generators is not None and len(generators) != len(prompts):
        raise ValueError(f"{len(generators)} generators for {len(prompts)} prompts")
    if not prompts:
        return SampleOutput([], [], [], [], [] if capture_hidden else None)
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
    lengths = torch.zeros(bsz, dtype=torch.long, device=device)
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
            lengths += (~done).long()
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
    comp, logps, fin, hidden = [], [], [], []
    for i in range(bsz):
        n = int(lengths[i])
        comp.append(toks[i, :n].tolist())
        logps.append(lps[i, :n].tolist())
        fin.append(n > 0 and comp[-1][-1] == eos_id)
        if hid is not None:
            hidden.append(hid[i, :n].contiguous())
    return SampleOutput([list(p) for p in prompts], comp, logps, fin, hidden if hid is not None else None)
