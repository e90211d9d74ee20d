"""The sampler's static-cache decoder against HF's forward: same greedy tokens, logprobs and hidden states (also
when finished rows are dropped from the batch), per-token logprobs equal to a recompute, weight copies refreshed
after in-place updates, and models it does not cover falling back to HF's forward."""

import pytest
import torch

from swarmrl.inference import SamplingParams, generate, static_decoder
from swarmrl.inference import sampler as sampler_mod
from swarmrl.inference.static_decoder import StaticDecoder, unsupported_reason
from swarmrl.models import ModelInitConfig, init_model


def _model(arch: str, kv_heads: int | None):
    model, tok = init_model(ModelInitConfig(arch=arch, hidden_size=64, num_layers=2, num_heads=4,
                                            num_kv_heads=kv_heads, intermediate_size=96, seed=3))
    return model, tok


def _prompts(tok):
    return [list(tok.encode(s, add_special_tokens=False)) for s in ("1+2=", "123+456=", "7*8+9=", "0", "99*99+1=")]


def _hf(model, prompts, params, eos, pad, gens=None):
    with torch.inference_mode():
        toks, lps, hid = sampler_mod._sample_hf(model, prompts, params, eos, pad, True, None, gens)
    return sampler_mod._output(prompts, toks, lps, hid, eos)


@pytest.mark.parametrize("onednn", [False, True], ids=["mm", "onednn"])
@pytest.mark.parametrize(("arch", "kv_heads"), [("qwen2", None), ("llama", 2), ("qwen2", 1)])
def test_static_decoder_equals_hf_forward(arch, kv_heads, onednn, monkeypatch):
    monkeypatch.setattr(static_decoder, "ONEDNN_MIN_PARAMS", 0 if onednn else 1 << 60)
    model, tok = _model(arch, kv_heads)
    assert unsupported_reason(model) is None
    assert StaticDecoder.for_model(model).head.onednn == (onednn and torch.backends.mkldnn.is_available())
    prompts = _prompts(tok) * 2
    greedy, sample = SamplingParams(max_new_tokens=12, temperature=0.0), SamplingParams(max_new_tokens=12)

    def gens():  # per-row streams: the same draws in both paths, whichever rows are still in the batch
        return [torch.Generator().manual_seed(i) for i in range(len(prompts))]

    probe = _hf(model, prompts, sample, -1, tok.pad_token_id, gens=gens())

    def stops(t):  # how many different steps the rows would stop at if t were EOS
        return len({c.index(t) if t in c else -1 for c in probe.completion_ids})

    eos = max(sorted({t for c in probe.completion_ids for t in c}), key=stops)
    for params, eos_id in ((greedy, -1), (sample, -1), (sample, eos)):
        ref = _hf(model, prompts, params, eos_id, tok.pad_token_id, gens=gens())
        out = generate(model, prompts, params, eos_id, tok.pad_token_id, capture_hidden=True, generators=gens())
        assert out.completion_ids == ref.completion_ids and out.finished == ref.finished
        if eos_id >= 0:  # rows stopped at different steps: finished rows were dropped mid-batch
            assert len({len(c) for c in out.completion_ids}) > 2 and any(out.finished)
        for a, b in zip(out.logprobs, ref.logprobs):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
        for a, b in zip(out.hidden, ref.hidden):
            assert a.dtype == torch.bfloat16 and a.shape == b.shape
            torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("params", [SamplingParams(max_new_tokens=10, temperature=1.0),
                                    SamplingParams(max_new_tokens=10, temperature=0.7, top_p=0.9)])
def test_logprobs_and_states_equal_a_recompute(params):
    model, tok = _model("llama", 2)
    prompts = _prompts(tok)
    gens = [torch.Generator().manual_seed(i) for i in range(len(prompts))]
    out = generate(model, prompts, params, tok.eos_token_id, tok.pad_token_id, capture_hidden=True, generators=gens)
    cap = {}
    hook = model.get_output_embeddings().register_forward_pre_hook(lambda _m, a: cap.__setitem__("h", a[0]))
    try:
        for p, c, lp, hid in zip(out.prompt_ids, out.completion_ids, out.logprobs, out.hidden):
            with torch.no_grad():
                logits = model(torch.tensor([p + c])).logits[0].float()
            want = torch.log_softmax(logits / params.temperature, -1)[len(p) - 1: len(p) - 1 + len(c)]
            want = want.gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
            torch.testing.assert_close(torch.tensor(lp), want, atol=1e-5, rtol=0)
            h = cap["h"][0, len(p) - 1: len(p) - 1 + len(c)].to(torch.bfloat16)
            torch.testing.assert_close(hid.float(), h.float(), atol=2e-2, rtol=1e-2)
    finally:
        hook.remove()


def test_weight_copies_follow_in_place_updates():
    model, tok = _model("qwen2", None)
    prompts = _prompts(tok)
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    before = generate(model, prompts, greedy, -1, tok.pad_token_id)
    assert StaticDecoder.for_model(model) is StaticDecoder.for_model(model)  # reused while unchanged
    torch.manual_seed(1)
    with torch.no_grad():
        for prm in model.parameters():
            prm.add_(0.3 * torch.randn_like(prm))
    after = generate(model, prompts, greedy, -1, tok.pad_token_id)
    assert after.completion_ids == _hf(model, prompts, greedy, -1, tok.pad_token_id).completion_ids
    assert after.completion_ids != before.completion_ids


def test_other_models_use_hf_forward(monkeypatch):
    model, tok = _model("llama", None)
    model.config.layer_types = ["sliding_attention"] * model.config.num_hidden_layers
    assert "sliding" in unsupported_reason(model)
    model.config.layer_types = None
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    want = generate(model, _prompts(tok), greedy, -1, tok.pad_token_id).completion_ids
    monkeypatch.setattr(sampler_mod, "unsupported_reason", lambda _m: "not covered")
    monkeypatch.setattr(sampler_mod, "_sample_static", None)  # would fail if called
    assert generate(model, _prompts(tok), greedy, -1, tok.pad_token_id).completion_ids == want


def _count_prefill_rows(monkeypatch) -> list[int]:
    """The row count of every prefill the static decoder runs from now on (the list fills as it runs)."""
    seen: list[int] = []
    real = StaticDecoder.prefill

    def spy(self, rows, *a, **kw):
        seen.append(len(rows))
        return real(self, rows, *a, **kw)

    monkeypatch.setattr(StaticDecoder, "prefill", spy)
    return seen


def test_a_groups_prompt_is_prefilled_once(monkeypatch):
    """Rows that repeat a prompt (a GRPO group) share one prefill; every row still gets what HF computes for it."""
    model, tok = _model("qwen2", 2)
    base = _prompts(tok)
    prompts = [p for p in base for _ in range(4)] + [base[0]]  # groups of 4, and a repeat out of order
    seen = _count_prefill_rows(monkeypatch)
    params = SamplingParams(max_new_tokens=8)
    gens = [torch.Generator().manual_seed(i) for i in range(len(prompts))]
    out = generate(model, prompts, params, -1, tok.pad_token_id, capture_hidden=True, generators=gens)
    assert seen == [len(base)]
    ref = _hf(model, prompts, params, -1, tok.pad_token_id, gens=[torch.Generator().manual_seed(i) for i in range(len(prompts))])
    assert out.completion_ids == ref.completion_ids
    assert len({tuple(c) for c in out.completion_ids[:4]}) > 1  # the group's rows drew their own tokens
    for a, b in zip(out.logprobs, ref.logprobs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
    for a, b in zip(out.hidden, ref.hidden):
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=1e-2)


def test_share_prompts_off_prefills_every_row_with_the_same_result(monkeypatch):
    """``share_prompts=False`` (the benchmark's baseline) prefills every row and samples exactly what sharing does."""
    model, tok = _model("qwen2", 2)
    prompts = [p for p in _prompts(tok) for _ in range(3)]
    seen = _count_prefill_rows(monkeypatch)
    params = SamplingParams(max_new_tokens=6)
    outs = [generate(model, prompts, params, -1, tok.pad_token_id, capture_hidden=True, share_prompts=share,
                     generators=[torch.Generator().manual_seed(i) for i in range(len(prompts))])
            for share in (True, False)]
    assert seen == [len(prompts) // 3, len(prompts)]
    assert outs[0].completion_ids == outs[1].completion_ids
    for a, b in zip(outs[0].logprobs, outs[1].logprobs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-6, rtol=0)
