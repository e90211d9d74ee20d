"""The generated corpus: deterministic, per-worker streams, held-out eval split."""

import torch

from swarmrl.diloco.data import PackedCorpus, eval_loss
from swarmrl.envs.config import TaskConfig
from swarmrl.models import ModelInitConfig, build_char_tokenizer, init_model

torch.set_num_threads(1)


def test_batches_are_deterministic_per_worker_and_heldout_is_disjoint():
    tok = build_char_tokenizer()
    env = TaskConfig(name="mul_add").build()
    c = PackedCorpus(env, tok, seq_len=32, seed=0)
    a = c.train_batch(rank=0, step=3, batch_size=4)
    assert a.shape == (4, 32) and a.dtype == torch.long
    assert torch.equal(a, c.train_batch(rank=0, step=3, batch_size=4))
    assert not torch.equal(a, c.train_batch(rank=1, step=3, batch_size=4))
    assert not torch.equal(a, c.train_batch(rank=0, step=4, batch_size=4))
    ev = c.eval_batch(8)
    assert torch.equal(ev, PackedCorpus(env, tok, seq_len=32, seed=0).eval_batch(8))
    train_text = "".join(tok.decode(row) for s in range(8) for row in c.train_batch(0, s, 8).tolist())
    eval_lines = [l for l in tok.decode(ev.view(-1).tolist()).split("\n")[1:-1] if l]
    assert eval_lines and all("=" in l for l in eval_lines)
    # held-out expressions (full lines) never appear in the training stream
    assert not any(f"\n{l}\n" in train_text for l in eval_lines)


def test_eval_loss_is_finite_and_keeps_mode():
    model, tok = init_model(ModelInitConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64))
    c = PackedCorpus(TaskConfig(name="mul_add").build(), tok, seq_len=16)
    model.train()
    loss = eval_loss(model, c.eval_batch(4))
    assert 0 < loss < 20 and model.training


def test_answer_mask_marks_answers_and_their_newline():
    from swarmrl.diloco.data import answer_mask

    # tokens: 1 2 = 3 4 \n 5 = 6 \n 7   (= is 9, \n is 8)
    batch = torch.tensor([[1, 2, 9, 3, 4, 8, 5, 9, 6, 8, 7]])
    m = answer_mask(batch, sep_id=9, eol_id=8)
    assert m[0].tolist() == [False, False, False, True, True, True, False, False, True, True, False]


def test_masked_mean_over_every_target_equals_the_mean_and_an_answer_mask_differs():
    from swarmrl.diloco.data import answer_mask, masked_mean, mean_loss, token_losses

    model, tok = init_model(ModelInitConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64))
    c = PackedCorpus(TaskConfig(name="mul_add").build(), tok, seq_len=16)
    ev = c.eval_batch(4)
    ce = token_losses(model, ev)
    full = masked_mean(ce, torch.ones_like(ev, dtype=torch.bool))
    assert abs(full - mean_loss(ce)) < 1e-9
    sep, eol = tok.encode("=", add_special_tokens=False)[0], tok.encode("\n", add_special_tokens=False)[0]
    m = answer_mask(ev, sep, eol)
    assert 0 < int(m.sum()) < m.numel()
    assert abs(masked_mean(ce, m) - float(ce[m[:, 1:]].double().mean())) < 1e-9
    assert masked_mean(ce, m) != full


@torch.no_grad()
def test_token_losses_reduce_to_the_models_own_loss_per_sequence_and_overall():
    from swarmrl.diloco.data import mean_loss, seq_losses, token_losses

    model, tok = init_model(ModelInitConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64))
    ev = PackedCorpus(TaskConfig(name="mul_add").build(), tok, seq_len=16).eval_batch(20)
    model.train()
    ce = token_losses(model, ev, chunk=16)  # 20 sequences over two chunks: none lost, none twice
    assert ce.shape == (20, 15) and model.training
    model.eval()  # the reference: the model's own (Hugging Face) loss, computed apart from token_losses
    ref = float(model(input_ids=ev, labels=ev).loss)
    assert abs(mean_loss(ce) - ref) < 1e-5 and abs(eval_loss(model, ev) - ref) < 1e-5
    per = seq_losses(ce)
    assert len(per) == 20 and abs(sum(per) / len(per) - ref) < 1e-5
    for i in (0, 15, 16, 19):
        assert abs(per[i] - float(model(input_ids=ev[i: i + 1], labels=ev[i: i + 1]).loss)) < 1e-5
    assert len(set(per)) > 1
