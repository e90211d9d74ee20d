"""The sampling check: implausible tokens, claimed logprobs, termination."""

from __future__ import annotations

import torch

from swarmrl.toploc.sampling_check import SamplingClaim, SamplingThresholds, check_sampling, termination_reasons

EOS = 2
V = 10


def _logits(n: int) -> torch.Tensor:
    # token 5 dominant, 6 second, the rest tiny
    lg = torch.full((n, V), -20.0)
    lg[:, 5] = 3.0
    lg[:, 6] = 2.0
    lg[:, EOS] = 0.0
    return lg


def _lp(lg: torch.Tensor, toks: list[int], t: float = 1.0) -> list[float]:
    lp = torch.log_softmax(lg / (t or 1.0), -1)
    return [float(lp[i, x]) for i, x in enumerate(toks)]


def test_honest_completion_passes():
    lg = _logits(4)
    toks = [5, 6, 5, EOS]
    c = check_sampling(lg, toks, SamplingClaim(EOS, 1.0, 1.0, _lp(lg, toks), True, 16))
    assert c.passed, c.reasons


def test_low_probability_token_is_flagged():
    lg = _logits(3)
    lg[1, 9] = -40.0
    toks = [5, 9, EOS]  # token 9 has logprob ~ -43, below the default floor of -30
    c = check_sampling(lg, toks, SamplingClaim(EOS, 1.0, 1.0, _lp(lg, toks), True, 16))
    assert not c.passed and c.n_implausible == 1 and "implausible" in c.reasons[0]


def test_rare_but_possible_token_is_not_flagged_by_default():
    lg = _logits(3)
    toks = [5, 9, EOS]  # token 9 has logprob ~ -23: rare, but honest sampling does produce such tokens
    claim = SamplingClaim(EOS, 1.0, 1.0, _lp(lg, toks), True, 16)
    assert check_sampling(lg, toks, claim).passed
    strict = check_sampling(lg, toks, claim, SamplingThresholds(min_token_logprob=-12.0))
    assert not strict.passed and strict.n_implausible == 1


def test_token_outside_top_p_nucleus_is_flagged():
    lg = _logits(3)
    toks = [5, 6, EOS]  # p(5) ~ 0.71: with top_p 0.5 only token 5 is in the nucleus
    claim = SamplingClaim(EOS, 1.0, 0.5, _lp(lg, toks), True, 16)
    c = check_sampling(lg, toks, claim)
    assert not c.passed and c.n_implausible == 2
    assert check_sampling(lg, toks, SamplingClaim(EOS, 1.0, 0.99, _lp(lg, toks), True, 16)).passed


def test_greedy_must_take_the_argmax():
    lg = _logits(2)
    assert check_sampling(lg, [5, 5], SamplingClaim(EOS, 0.0, 1.0, _lp(lg, [5, 5]), False, 2)).passed
    c = check_sampling(lg, [6, 5], SamplingClaim(EOS, 0.0, 1.0, _lp(lg, [6, 5]), False, 2))
    assert not c.passed and c.n_implausible == 1


def test_claimed_logprobs_must_match():
    lg = _logits(3)
    toks = [5, 6, EOS]
    lp = _lp(lg, toks)
    lp[1] += 0.7
    c = check_sampling(lg, toks, SamplingClaim(EOS, 1.0, 1.0, lp, True, 16))
    assert not c.passed and any("claimed logprob" in r for r in c.reasons)
    # temperature changes the logprobs: a claim made at T=1 does not match T=0.5
    c = check_sampling(lg, toks, SamplingClaim(EOS, 0.5, 1.0, _lp(lg, toks, 1.0), True, 16))
    assert not c.passed
    c = check_sampling(lg, toks, SamplingClaim(EOS, 1.0, 1.0, lp[:2], True, 16))
    assert not c.passed and "2 claimed logprobs" in c.reasons[0]
    c = check_sampling(lg, toks, SamplingClaim(EOS, 1.0, 1.0, [float("nan")] * 3, True, 16))
    assert not c.passed
    assert not check_sampling(lg, toks, SamplingClaim(EOS), SamplingThresholds(min_token_logprob=-1e-9)).passed


def test_termination_rules():
    c = lambda **kw: SamplingClaim(EOS, **kw)  # noqa: E731
    assert termination_reasons([5, EOS], c(finished=True, max_new_tokens=4)) == []
    assert termination_reasons([5, 5, 5, 5], c(finished=False, max_new_tokens=4)) == []
    assert "text after EOS" in termination_reasons([5, EOS, 5, EOS], c(finished=True))[0]
    assert "finished=True" in termination_reasons([5, 5], c(finished=True))[0]
    assert "finished=False" in termination_reasons([5, EOS], c(finished=False))[0]
    assert "without EOS" in termination_reasons([5, 5], c(finished=False, max_new_tokens=4))[0]
    assert "more than" in termination_reasons([5] * 5, c(max_new_tokens=4))[0]


def test_shape_and_vocab_problems_are_reasons():
    lg = _logits(2)
    assert not check_sampling(lg, [5], SamplingClaim(EOS)).passed
    assert not check_sampling(lg, [5, 99], SamplingClaim(EOS)).passed
    assert not check_sampling(lg[:0], [], SamplingClaim(EOS)).passed
