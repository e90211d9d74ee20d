"""TOPLOC on a real (tiny) model: honest sampling verifies under any batch composition, tampering fails."""

from __future__ import annotations

import random

import pytest
import torch

from swarmrl.inference.sampler import SamplingParams, generate
from swarmrl.models import ModelInitConfig, init_model
from swarmrl.toploc import Thresholds, build_proofs
from swarmrl.toploc.calibrate import change_token, perturb_weights, quantize_int8, reinit_model
from swarmrl.toploc.rollout import recompute, verify_rollout, verify_rollouts
from swarmrl.toploc.sampling_check import SamplingClaim, SamplingThresholds

torch.set_num_threads(1)
MAX_NEW = 40  # two chunks: 32 + 8 positions
# calibrated on the tiny fp32 model (see `swarmrl toploc calibrate`): honest recomputation is exact here
TIGHT = Thresholds(max_exp_mismatches=2, max_mant_err_mean=1.0, max_mant_err_median=1)
TIGHT_SAMPLING = SamplingThresholds(max_logprob_diff=0.002, max_mean_logprob_diff=0.001)


@pytest.fixture(scope="module")
def setup():
    model, tok = init_model(ModelInitConfig(seed=0))
    texts = ["What is 12+7? ", "hi", "Compute 3*4+5 =", "a", "The answer is", "99-1="]
    prompts = [tok.encode(t, add_special_tokens=False) for t in texts]
    return model, tok, prompts


def _sample(model, tok, prompts, seed=0):
    params = SamplingParams(max_new_tokens=MAX_NEW, temperature=1.0)
    return generate(model, prompts, params, tok.eos_token_id, tok.pad_token_id, capture_hidden=True,
                    generator=torch.Generator().manual_seed(seed))


def _items(out, tok, prompts=None, completions=None, proofs=None):
    prompts = prompts or out.prompt_ids
    completions = completions or out.completion_ids
    proofs = proofs or [build_proofs(h) for h in out.hidden]
    return [(p, c, pr, SamplingClaim(eos_id=tok.eos_token_id, temperature=1.0, logprobs=lp, finished=f,
                                     max_new_tokens=MAX_NEW))
            for p, c, pr, lp, f in zip(prompts, completions, proofs, out.logprobs, out.finished)]


@pytest.fixture(scope="module")
def honest(setup):
    model, tok, prompts = setup
    return _sample(model, tok, prompts)


def test_recompute_matches_sampler_states(setup, honest):
    model, _, _ = setup
    recs = recompute(model, list(zip(honest.prompt_ids, honest.completion_ids)), batch_size=6)
    for rec, h in zip(recs, honest.hidden):
        assert rec.hidden.shape == h.shape and rec.hidden.dtype == torch.bfloat16
        # same bf16 states up to rare rounding flips
        assert (rec.hidden.float() - h.float()).abs().max() < 0.1


def test_groups_sharing_a_prompt_recompute_the_same_states_as_a_full_prefill(setup):
    """Rows that repeat a prompt (a group's completions) prefill it once and decode the completions on its cached
    keys and values: the same states and logits as one prefill per row, for mixed prompt lengths, completion
    lengths (one token included) and prompts seen once, and the honest rows still pass TOPLOC and sampling."""
    model, tok, prompts = setup
    group = [p for p in prompts[:3] for _ in range(3)] + [prompts[3]]  # three groups of 3 and a lone prompt
    out = _sample(model, tok, group, seed=4)
    pairs = list(zip(out.prompt_ids, out.completion_ids))
    pairs.append((prompts[0], [5]))  # a one-token completion after a shared prompt
    full = recompute(model, pairs, batch_size=16, shared_prompts=False)
    shared = recompute(model, pairs, batch_size=16)
    assert len(full) == len(shared) == len(pairs)
    for a, b, (_, c) in zip(full, shared, pairs):
        assert a.hidden.shape == b.hidden.shape == (len(c), a.hidden.shape[1]) and b.hidden.dtype == torch.bfloat16
        assert (a.hidden.float() - b.hidden.float()).abs().max() < 0.1  # bf16: rare rounding flips at most
        assert torch.allclose(a.logits, b.logits, atol=1e-4)
    res = verify_rollouts(model, _items(out, tok), batch_size=16, thresholds=TIGHT)
    assert all(r.passed for r in res), [r.reason for r in res if not r.passed]


@pytest.mark.parametrize("batch_size,shuffle", [(1, False), (3, True), (6, True)])
def test_honest_passes_with_any_batch_composition(setup, honest, batch_size, shuffle):
    model, tok, _ = setup
    items = _items(honest, tok)
    if shuffle:
        random.Random(batch_size).shuffle(items)
        # different padding: an unrelated long row in the same batch
        items.insert(1, (list(range(5, 60)), [7, 8, 9], build_proofs(torch.zeros(3, 128)), None))
    res = verify_rollouts(model, items, batch_size=batch_size, thresholds=TIGHT)
    for item, r in zip(items, res):
        if item[3] is None:
            continue
        assert r.passed, r.reason
        assert len(r.chunks) == 2 and r.sampling is not None and r.sampling.passed


def test_honest_single_verify_and_threads(setup, honest):
    model, tok, _ = setup
    item = _items(honest, tok)[0]
    torch.set_num_threads(2)
    try:
        r = verify_rollout(model, item[0], item[1], item[2], claim=item[3], thresholds=TIGHT)
    finally:
        torch.set_num_threads(1)
    assert r.passed, r.reason
    assert all(c.exp_mismatches <= 1 for c in r.chunks)


def _fail_rate(model, items, thresholds=None) -> tuple[float, list]:
    res = verify_rollouts(model, items, batch_size=6, thresholds=thresholds)
    return sum(not r.proofs_passed for r in res) / len(res), res


def test_another_model_fails_with_default_thresholds(setup):
    model, tok, prompts = setup
    out = _sample(reinit_model(model, 1000), tok, prompts, seed=1)
    rate, res = _fail_rate(model, _items(out, tok))
    assert rate == 1.0
    assert all(not r.passed and "chunk" in r.reason for r in res)


def test_changed_prompt_fails(setup):
    model, tok, prompts = setup
    rng = random.Random(0)
    changed = [change_token(p, len(p) - 1, 260, {tok.eos_token_id}, rng) for p in prompts]
    out = _sample(model, tok, changed, seed=2)
    # an untrained tiny model mixes little context into its states: the published defaults catch only
    # part of these (see the calibration table); thresholds calibrated on the model catch all
    rate, _ = _fail_rate(model, _items(out, tok, prompts=prompts), TIGHT)
    assert rate == 1.0


def test_perturbed_weights_fail_with_calibrated_thresholds(setup):
    model, tok, prompts = setup
    out = _sample(perturb_weights(model, 0.01, seed=3), tok, prompts, seed=3)
    rate, _ = _fail_rate(model, _items(out, tok), TIGHT)
    assert rate == 1.0


def test_quantized_weights_fail_with_calibrated_thresholds(setup):
    model, tok, prompts = setup
    out = _sample(quantize_int8(model), tok, prompts, seed=3)
    items = _items(out, tok)
    rate, _ = _fail_rate(model, items, TIGHT)
    assert rate >= 0.5, rate  # int8 states are close to fp32 ones on this tiny model: TOPLOC alone catches most
    res = verify_rollouts(model, items, batch_size=6, thresholds=TIGHT, sampling_thresholds=TIGHT_SAMPLING)
    assert not any(r.passed for r in res)  # claimed logprobs (recomputed in the same prefill) catch the rest
    honest = verify_rollouts(model, _items(_sample(model, tok, prompts, seed=3), tok), batch_size=6, thresholds=TIGHT,
                             sampling_thresholds=TIGHT_SAMPLING)
    assert all(r.passed for r in honest)


def test_one_changed_completion_token_fails(setup, honest):
    model, tok, _ = setup
    rng = random.Random(1)
    comps = [change_token(c, 2, 260, {tok.eos_token_id}, rng) for c in honest.completion_ids]
    rate, res = _fail_rate(model, _items(honest, tok, completions=comps), TIGHT)
    assert rate == 1.0
    # the chunk before the change is untouched only when the change is in a later chunk; here chunk 0 fails
    assert all(not r.chunks[0].passed for r in res)


def test_hostile_rollout_items_are_rejected_not_raised(setup, honest):
    model, tok, _ = setup
    good = _items(honest, tok)[0]
    bad_items = [
        (good[0], [10**9], good[2], None),
        (good[0], [-1, 3], good[2], None),
        ([], good[1], good[2], None),
        (good[0], [], [], None),
        (good[0], [3] * 10_000, [], None),
        ("abc", None, None),
        (1, 2),
        None,
        (good[0], good[1], None, good[3]),
        (good[0], good[1], [b"\x00" * 258] * 2, good[3]),
        (good[0], good[1], good[2][:1], good[3]),
    ]
    res = verify_rollouts(model, bad_items + [good], batch_size=4)
    assert [r.passed for r in res] == [False] * len(bad_items) + [True]
    assert all(r.reason for r in res[:-1])

