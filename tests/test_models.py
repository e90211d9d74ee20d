import torch

from swarmrl.inference import SamplingParams, generate
from swarmrl.inference.prompts import decode_completion
from swarmrl.models import ModelInitConfig, init_model, load_model, load_tokenizer


def test_save_load_round_trip(tmp_path):
    for arch in ("qwen2", "llama"):
        d = tmp_path / arch
        model, tok = init_model(ModelInitConfig(arch=arch, hidden_size=32, num_layers=1, num_heads=2,
                                                intermediate_size=64), d)
        assert (d / "model.safetensors").is_file() and (d / "tokenizer.json").is_file()
        from transformers import AutoModelForCausalLM, AutoTokenizer

        m2 = AutoModelForCausalLM.from_pretrained(d, local_files_only=True)
        t2 = AutoTokenizer.from_pretrained(d, local_files_only=True)
        text = "12*7+33=117\n  tabs\tand unicode é <eos>"
        ids = t2.encode(text, add_special_tokens=False)
        assert t2.decode(ids) == text
        assert ids == tok.encode(text, add_special_tokens=False)
        assert ids[-1] == t2.eos_token_id
        x = torch.tensor([ids])
        with torch.no_grad():
            assert torch.equal(model(x).logits, m2(x).logits)


def test_sampler_matches_single_prefill(tiny_model_dir):
    m, tok = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    prompts = [tok.encode(s, add_special_tokens=False) for s in ["1+2=", "123+456=", "7*8+9="]]
    g = torch.Generator().manual_seed(0)
    out = generate(m, prompts, SamplingParams(max_new_tokens=6, temperature=0.7), tok.eos_token_id,
                   tok.pad_token_id, capture_hidden=True, generator=g)
    for i in range(3):
        p, c = out.prompt_ids[i], out.completion_ids[i]
        assert 1 <= len(c) <= 6 and len(out.logprobs[i]) == len(c) == out.hidden[i].shape[0]
        cap = {}
        h = m.get_output_embeddings().register_forward_pre_hook(lambda _m, a: cap.__setitem__("h", a[0]))
        with torch.no_grad():
            logits = m(torch.tensor([p + c])).logits[0]
        h.remove()
        lp = torch.log_softmax(logits.float() / 0.7, -1)[len(p) - 1: len(p) - 1 + len(c)]
        ref = lp.gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
        torch.testing.assert_close(ref, torch.tensor(out.logprobs[i]), atol=1e-5, rtol=0)
        hid = cap["h"][0, len(p) - 1: len(p) - 1 + len(c)].to(torch.bfloat16)
        torch.testing.assert_close(hid.float(), out.hidden[i].float(), atol=2e-2, rtol=1e-2)


def test_greedy_is_deterministic_and_stops_at_eos(tiny_model_dir):
    m, tok = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    prompts = [tok.encode("5+5=", add_special_tokens=False)] * 3
    a = generate(m, prompts, SamplingParams(max_new_tokens=5, temperature=0.0), tok.eos_token_id, tok.pad_token_id)
    assert a.completion_ids[0] == a.completion_ids[1] == a.completion_ids[2]
    for ids, fin in zip(a.completion_ids, a.finished):
        assert fin == (tok.eos_token_id in ids)
        if fin:
            assert ids.index(tok.eos_token_id) == len(ids) - 1
    assert decode_completion(tok, [tok.encode("4", add_special_tokens=False)[0], tok.eos_token_id, 7]) == "4"
