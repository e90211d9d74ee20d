"""Evaluating an in-memory model (the trainer's between steps, SFT's) samples on the model's own weights and leaves
no copy behind: the sampler's static decoder copies every weight into its own layout (about the model's size again)
and kept those copies for as long as the model lived, so a trainer held a second copy of its model from its first
evaluation on, and made a fresh one at every evaluation (SmolLM2-135M: ~0.5 GB of a 3.0 GB peak)."""

from __future__ import annotations

import torch
from memory_support import live_tensor_bytes

from swarmrl.envs import make_env
from swarmrl.eval.heldout import evaluate
from swarmrl.inference.params import TokenLimits
from swarmrl.models import load_model, load_tokenizer

torch.set_num_threads(1)


def test_evaluating_a_model_keeps_no_copy_of_its_weights(tiny_model_dir):
    model, tok = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    before = live_tensor_bytes()
    res = evaluate(model, tok, make_env("add", digits=2), n=16, batch_size=8, limits=TokenLimits(max_new_tokens=4))
    assert res["n"] == 16
    held = live_tensor_bytes() - before
    assert held < 0.25 * weights, f"{held} bytes of tensors left after the evaluation (weights: {weights})"

    # a model that does not change between generations keeps its copies (the decoder is reused, not rebuilt)
    from swarmrl.inference.sampler import SamplingParams, generate
    from swarmrl.inference.static_decoder import StaticDecoder

    generate(model, [[5, 6, 7]], SamplingParams(max_new_tokens=2), tok.eos_token_id, tok.pad_token_id)
    assert StaticDecoder.for_model(model) is StaticDecoder.for_model(model)


def test_sampling_on_borrowed_weights_matches_the_copies(tiny_model_dir):
    """The no-copy path computes what the copies do: the same greedy tokens, logprobs within float32 rounding."""
    from swarmrl.inference.sampler import SamplingParams, generate
    from swarmrl.inference.static_decoder import _CACHE, borrowed_weights

    model, tok = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    prompts = [tok.encode(p, add_special_tokens=False) for p in ("12+30=", "7+45=", "99+1=")]
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    copied = generate(model, prompts, params, tok.eos_token_id, tok.pad_token_id)
    assert model in _CACHE  # sampled on the decoder's copies
    with borrowed_weights(model):
        borrowed = generate(model, prompts, params, tok.eos_token_id, tok.pad_token_id)
        dec = _CACHE[model][1]
        assert all(p.parts is not None for p in (dec.head, *(ly.qkv for ly in dec.layers)))  # no copies made
    assert model not in _CACHE
    assert borrowed.completion_ids == copied.completion_ids
    for a, b in zip(borrowed.logprobs, copied.logprobs):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-4)
