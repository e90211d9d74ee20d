"""A group's prompt computed once (``swarmrl.rollouts.shared``): the same logprobs, entropies and gradients as one
sequence per row, from fewer tokens."""

import random

import pytest
import torch

from swarmrl.rollouts import packing
from swarmrl.rollouts.packing import Sequence
from swarmrl.rollouts.shared import pack_shared, shared_logprobs, supports_shared


def _groups(rng: random.Random, n_groups: int, size: int, multiturn: bool = False) -> list[Sequence]:
    seqs = []
    for _ in range(n_groups):
        prompt = [rng.randrange(4, 200) for _ in range(rng.randint(1, 9))]
        for _ in range(size):
            c = rng.randint(0, 7)
            comp = [rng.randrange(4, 200) for _ in range(c)]
            mask = [rng.randint(0, 1) for _ in range(c)] if multiturn else None
            seqs.append(Sequence(prompt, comp, [rng.uniform(-3, 0) for _ in range(c)], rng.uniform(-1, 1), 0.7,
                                 mask=mask))
    rng.shuffle(seqs)  # members of a group need not be adjacent
    return seqs


def test_pack_shared_lays_a_group_behind_its_prompt_once():
    seqs = [Sequence([1, 2, 3], [4, 5], [-0.5, -0.25], 1.0, 1.0), Sequence([6], [7], [-1.0], 0.0, 1.0),
            Sequence([1, 2, 3], [8], [-2.0], 0.0, 1.0)]
    p = pack_shared(seqs, pad_id=0)
    assert p["ids"].tolist() == [[1, 2, 3, 4, 5, 8], [6, 7, 0, 0, 0, 0]]
    assert p["pos"].tolist() == [[0, 1, 2, 3, 4, 3], [0, 1, 0, 0, 0, 0]]
    a = p["allowed"][0].int().tolist()
    assert a[3] == [1, 1, 1, 1, 0, 0] and a[4] == [1, 1, 1, 1, 1, 0]  # member 1 sees the prompt and itself
    assert a[5] == [1, 1, 1, 0, 0, 1]  # member 2 never sees member 1
    # token 0 of each member is predicted at the prompt's last position (2), later tokens at their own previous one;
    # gathered group by group
    assert list(zip(p["row"].tolist(), p["at"].tolist(), p["target"].tolist())) == [(0, 2, 4), (0, 3, 5), (0, 2, 8),
                                                                                      (1, 0, 7)]
    assert p["cmask"].tolist() == [[1, 1], [1, 0], [1, 0]]
    assert p["old"].tolist() == [[-0.5, -0.25], [-1.0, 0], [-2.0, 0]]
    with pytest.raises(ValueError):
        pack_shared([Sequence([], [4], [-1.0], 0.0, 1.0)], 0)


def test_a_group_past_the_row_bound_continues_in_another_row_behind_its_prompt():
    seqs = [Sequence([1, 2], [3, 4, 5], [-1.0] * 3, 0.0, 1.0) for _ in range(3)] + [
        Sequence([1, 2], [6] * 9, [-1.0] * 9, 0.0, 1.0)]
    p = pack_shared(seqs, 0, max_row_tokens=8)
    # 2 + 3 + 3 = 8 fits; the third member starts a row; the long one (2 + 9 > 8) takes a row alone
    assert p["ids"][:, :2].tolist() == [[1, 2]] * 3
    assert p["ids"].shape == (3, 11) and p["row"].tolist() == [0] * 6 + [1] * 3 + [2] * 9


@pytest.mark.parametrize("multiturn,attention,max_row", [(False, "sdpa", 1024), (True, "sdpa", 1024),
                                                         (False, "eager", 1024), (False, "sdpa", 12)])
def test_shared_logprobs_equal_one_sequence_per_row(tiny_model_dir, monkeypatch, multiturn, attention, max_row):
    from swarmrl.models.io import load_model

    model = load_model(tiny_model_dir).train()
    model.config._attn_implementation = attention
    assert supports_shared(model)
    monkeypatch.setattr(packing, "CHUNK_TOKENS", 5)
    seqs = _groups(random.Random(1 + multiturn), 3, 4, multiturn)
    shared = pack_shared(seqs, 0, max_row_tokens=max_row)
    assert (shared["ids"].shape[0] > 3) == (max_row < 1024)  # the small bound splits groups
    plain = packing.pack(seqs, 0)
    assert shared["ids"].numel() < plain["ids"].numel()
    a, ea = shared_logprobs(model, shared, 0.7, with_entropy=True, entropy_grad=True)
    b, eb = packing.sequence_logprobs(model, plain, 0.7, with_entropy=True, entropy_grad=True)
    m = shared["cmask"]
    assert float(m.sum()) == float(plain["cmask"].sum()) > 0
    for i, s in enumerate(seqs):  # completion token t sits at [i, t] shared, [i, p - 1 + t] plain
        p, c = len(s.prompt_ids), len(s.completion_ids)
        assert torch.allclose(a[i, :c] * m[i, :c], b[i, p - 1: p - 1 + c] * m[i, :c], atol=1e-5)
        assert torch.allclose(ea[i, :c] * m[i, :c], eb[i, p - 1: p - 1 + c] * m[i, :c], atol=1e-5)
        assert torch.equal(shared["old"][i, :c], plain["old"][i, p - 1: p - 1 + c])
    assert float((a.detach() * (1 - m)).abs().sum()) == 0.0
    params = list(model.parameters())
    ga = torch.autograd.grad(((a + ea) * m).sum(), params, allow_unused=True)
    gb = torch.autograd.grad(((b + eb) * plain["cmask"]).sum(), params, allow_unused=True)
    assert max(float((x - y).abs().max()) for x, y in zip(ga, gb) if x is not None) <= 1e-4


def test_a_model_without_a_maskable_full_attention_is_refused(tiny_model_dir):
    from swarmrl.models.io import load_model

    model = load_model(tiny_model_dir)
    assert supports_shared(model)
    model.config.layer_types = ["sliding_attention"] * len(model.config.layer_types)  # a window the mask would drop
    assert not supports_shared(model)
    model.config.layer_types = ["full_attention"] * len(model.config.layer_types)
    model.config._attn_implementation = "flash_attention_2"
    assert not supports_shared(model)
    with pytest.raises(ValueError, match="supports_shared"):
        shared_logprobs(model, pack_shared([Sequence([1, 2], [3], [-1.0], 0.0, 1.0)], 0), 1.0)


@pytest.mark.parametrize("kind", ["grpo", "gspo"])
def test_the_update_with_shared_prompts_has_the_gradients_of_one_sequence_per_row(tiny_model_dir, kind):
    """``accumulate_gradients`` with ``Passes(share_prompts=True)``: the same loss and gradients, micro-batches cutting groups."""
    from swarmrl.models.io import load_model
    from swarmrl.rl.config import LossConfig
    from swarmrl.rl.train_step import Passes, WholeBatch, accumulate_gradients

    model = load_model(tiny_model_dir).train()
    seqs = _groups(random.Random(7), 3, 4)
    out = {}
    for share in (False, True):
        model.zero_grad(set_to_none=True)
        st = accumulate_gradients(model, seqs, LossConfig(kind=kind), 0, WholeBatch(8),
                                  Passes(5, share_prompts=share))
        out[share] = (st, [p.grad.clone() if p.grad is not None else None for p in model.parameters()])
    (a, ga), (b, gb) = out[False], out[True]
    assert abs(a.loss - b.loss) <= 1e-5 and a.stats.tokens == b.stats.tokens > 0
    assert max(float((x - y).abs().max()) for x, y in zip(ga, gb) if x is not None) <= 1e-5
    assert max(float(x.abs().max()) for x in ga if x is not None) > 1e-3  # not vacuous
