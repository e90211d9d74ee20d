"""Were the completion tokens plausibly sampled from the model? (TOPLOC alone does not say.)

A TOPLOC proof shows the worker ran the model over prompt + completion; it does not show the tokens
came from the model's distribution. With the logits the verifier recomputed in the same prefill we
flag, with reasons:

- a token that is implausible under the claimed temperature / top-p: outside the top-p nucleus (with
  slack for numerical noise), far from the argmax for greedy sampling, or with a tiny probability;
- claimed per-token logprobs that differ from the recomputed ones (same definition as the sampler:
  log_softmax(logits / T), at T = 1 for greedy);
- wrong termination: text after EOS, finished=True without a final EOS (or EOS with finished=False),
  no EOS although the completion is shorter than max_new_tokens, more than max_new_tokens tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from pydantic import Field

from swarmrl.config import StrictModel

__all__ = ["SamplingClaim", "SamplingThresholds", "SamplingCheck", "check_sampling", "token_stats"]


@dataclass
class SamplingClaim:
    """What the worker claims about how the completion was sampled."""

    eos_id: int
    temperature: float = 1.0
    top_p: float = 1.0
    logprobs: list[float] | None = None  # claimed, one per completion token
    finished: bool | None = None  # claimed "ended with EOS"
    max_new_tokens: int | None = None


class SamplingThresholds(StrictModel):
    # A token below this logprob (at temperature T) is implausible. Honest sampling lands below a
    # floor f with probability <= vocab * e^f per token: -12 gave ~1.6e-3 per token with a 260-token
    # vocabulary and slashed honest nodes within minutes; -30 keeps it under ~1e-8 even at 150k tokens.
    min_token_logprob: float = Field(-30.0, le=0)
    nucleus_slack: float = Field(0.02, ge=0)  # mass before the token may exceed top_p by this much
    greedy_margin: float = Field(0.05, ge=0)  # greedy: token logprob may be this far below the argmax's
    max_implausible_tokens: int = Field(0, ge=0)
    max_logprob_diff: float = Field(0.5, ge=0)  # per token |claimed - recomputed|
    max_mean_logprob_diff: float = Field(0.05, ge=0)


@dataclass
class SamplingCheck:
    passed: bool
    reasons: list[str] = field(default_factory=list)
    n_implausible: int = 0
    min_token_logprob: float = 0.0
    max_logprob_diff: float = 0.0
    mean_logprob_diff: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def token_stats(logits: torch.Tensor, tokens: torch.Tensor, temperature: float, top_p: float
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per token: logprob as the sampler defines it, mass strictly before it, logprob gap to the argmax."""
    logits = logits.float()
    t = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits / t, dim=-1)
    tok_lp = logp.gather(-1, tokens[:, None]).squeeze(-1)
    probs = logp.exp()
    before = (probs * (logp > tok_lp[:, None])).sum(-1)
    gap = logp.max(-1).values - tok_lp
    return tok_lp, before, gap


def check_sampling(logits: torch.Tensor, completion_ids: list[int], claim: SamplingClaim,
                   thresholds: SamplingThresholds | None = None) -> SamplingCheck:
    """``logits``: [len(completion), vocab], row i = the recomputed logits that produced token i."""
    th = thresholds or SamplingThresholds()
    n = len(completion_ids)
    reasons: list[str] = []
    if logits.shape[0] != n:
        return SamplingCheck(False, [f"{logits.shape[0]} logit rows for {n} tokens"])
    if n == 0:
        return SamplingCheck(False, ["empty completion"])
    toks = torch.tensor(completion_ids, dtype=torch.long)
    if int(toks.min()) < 0 or int(toks.max()) >= logits.shape[1]:
        return SamplingCheck(False, ["token id outside the vocabulary"])
    tok_lp, before, gap = token_stats(logits, toks, claim.temperature, claim.top_p)
    bad = tok_lp < th.min_token_logprob
    if claim.temperature == 0.0:
        bad |= gap > th.greedy_margin
    elif claim.top_p < 1.0:
        bad |= before >= claim.top_p + th.nucleus_slack
    n_bad = int(bad.sum())
    if n_bad > th.max_implausible_tokens:
        where = torch.nonzero(bad).flatten()[:5].tolist()
        reasons.append(f"{n_bad} token(s) implausible under temperature={claim.temperature:g} top_p={claim.top_p:g} "
                       f"(positions {where}{'...' if n_bad > 5 else ''})")
    max_d = mean_d = 0.0
    if claim.logprobs is not None:
        if len(claim.logprobs) != n:
            reasons.append(f"{len(claim.logprobs)} claimed logprobs for {n} tokens")
        else:
            claimed = torch.tensor(claim.logprobs, dtype=torch.float32)
            if not bool(torch.isfinite(claimed).all()):
                reasons.append("claimed logprobs are not finite")
            else:
                d = (claimed - tok_lp).abs()
                max_d, mean_d = float(d.max()), float(d.mean())
                if max_d > th.max_logprob_diff:
                    reasons.append(f"claimed logprob differs from recomputed by {max_d:.3g} > {th.max_logprob_diff} "
                                   f"(position {int(d.argmax())})")
                if mean_d > th.max_mean_logprob_diff:
                    reasons.append(f"mean logprob difference {mean_d:.3g} > {th.max_mean_logprob_diff}")
    reasons += termination_reasons(completion_ids, claim)
    return SamplingCheck(not reasons, reasons, n_bad, float(tok_lp.min()), max_d, mean_d)


def termination_reasons(completion_ids: list[int], claim: SamplingClaim) -> list[str]:
    out: list[str] = []
    eos = claim.eos_id
    n = len(completion_ids)
    if eos in completion_ids[:-1]:
        out.append(f"text after EOS (EOS at position {completion_ids.index(eos)} of {n})")
    ends = n > 0 and completion_ids[-1] == eos
    if claim.finished is True and not ends:
        out.append("finished=True but the completion does not end with EOS")
    if claim.finished is False and ends:
        out.append("finished=False but the completion ends with EOS")
    if claim.max_new_tokens is not None:
        if n > claim.max_new_tokens:
            out.append(f"{n} tokens, more than max_new_tokens={claim.max_new_tokens}")
        elif not ends and n < claim.max_new_tokens:
            out.append(f"stopped after {n} < max_new_tokens={claim.max_new_tokens} tokens without EOS")
    return out
