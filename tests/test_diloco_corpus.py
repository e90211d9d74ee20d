"""The standard-library corpus: split by file, deterministic batches, a bounded size, the byte-level tokenizer."""

import pytest
import torch

from swarmrl.diloco.config import CorpusConfig, DilocoConfig
from swarmrl.diloco.corpus import SPLITS, StdlibCorpus, build_corpus, byte_table, split_of, stdlib_files
from swarmrl.models import build_char_tokenizer

torch.set_num_threads(1)


def _tree(root, n=60, size=900):
    """A fake stdlib: n files whose content names them (so a window tells which file it came from)."""
    for i in range(n):
        p = root / ("pkg" if i % 3 else "") / f"mod{i:03d}.py"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text((f"# FILE{i:03d}\n" + f"x{i:03d} = {i}\n" * size)[:size])
    (root / "site-packages" / "thirdparty").mkdir(parents=True)
    (root / "site-packages" / "thirdparty" / "evil.py").write_text("THIRDPARTY\n" * 100)
    (root / "notes.txt").write_text("not python\n" * 100)
    return root


def test_files_are_the_stdlib_python_sources_only(tmp_path):
    rels = stdlib_files(_tree(tmp_path))
    assert len(rels) == 60 and rels == sorted(rels)
    assert all(r.endswith(".py") and "site-packages" not in r for r in rels)


def test_split_is_by_file_disjoint_and_stable(tmp_path):
    root = _tree(tmp_path, n=200, size=300)
    tok = build_char_tokenizer()
    cfg = CorpusConfig(heldout_frac=0.2, valid_frac=0.1)
    c = StdlibCorpus(cfg, tok, seq_len=16, root=root)
    by_split = {s: {f.rel for f in c.files if f.split == s} for s in SPLITS}
    assert all(by_split.values())
    assert not (by_split["train"] & by_split["heldout"]) and not (by_split["train"] & by_split["valid"])
    assert not (by_split["valid"] & by_split["heldout"])
    assert sum(map(len, by_split.values())) == len(c.files) == 200
    # the split of a path depends on the path only (not on the content, the other files, the cap or the seed)
    for f in c.files:
        assert f.split == split_of(f.rel, 0.2, 0.1)
    full = {f.rel: f.split for f in c.files}
    capped = StdlibCorpus(cfg.model_copy(update={"max_bytes": 20_000}), tok, seq_len=16, seed=3, root=root)
    assert 0 < len(capped.files) < len(c.files)
    assert all(full[f.rel] == f.split for f in capped.files)
    # the text of the training stream never comes from a held-out file, and the eval windows only from held-out ones
    def windows(batch):  # each window decoded on its own (joined ones would make up new marks at the seams)
        return [tok.decode(row) for row in batch.tolist()]

    train_text = [w for r in range(2) for s in range(20) for w in windows(c.train_batch(r, s, 32))]
    heldout_marks = {f"x{f.rel[-6:-3]} =" for f in c.files if f.split == "heldout"}
    train_marks = {f"x{f.rel[-6:-3]} =" for f in c.files if f.split == "train"}
    assert any(m in w for w in train_text for m in train_marks)
    assert not any(m in w for w in train_text for m in heldout_marks)
    eval_text = windows(c.eval_batch(64))
    assert any(m in w for w in eval_text for m in heldout_marks)
    assert not any(m in w for w in eval_text for m in train_marks)


def test_batches_are_deterministic_per_seed_rank_and_step(tmp_path):
    root = _tree(tmp_path)
    tok = build_char_tokenizer()
    c = StdlibCorpus(CorpusConfig(), tok, seq_len=32, seed=0, root=root)
    a = c.train_batch(rank=0, step=3, batch_size=4)
    assert a.shape == (4, 32) and a.dtype == torch.long
    again = StdlibCorpus(CorpusConfig(), tok, seq_len=32, seed=0, root=root)
    assert torch.equal(a, again.train_batch(rank=0, step=3, batch_size=4))
    assert not torch.equal(a, c.train_batch(rank=1, step=3, batch_size=4))
    assert not torch.equal(a, c.train_batch(rank=0, step=4, batch_size=4))
    other_seed = StdlibCorpus(CorpusConfig(), tok, seq_len=32, seed=1, root=root)
    assert not torch.equal(a, other_seed.train_batch(rank=0, step=3, batch_size=4))
    assert torch.equal(c.eval_batch(8), other_seed.eval_batch(8))  # the eval set does not depend on the seed
    assert c.digest == again.digest == other_seed.digest


def test_size_cap_bounds_what_is_read_and_changes_the_digest(tmp_path):
    root = _tree(tmp_path, n=100, size=1000)
    tok = build_char_tokenizer()
    full = StdlibCorpus(CorpusConfig(), tok, seq_len=16, root=root)
    capped = StdlibCorpus(CorpusConfig(max_bytes=30_000), tok, seq_len=16, root=root)
    assert full.bytes_read == 100_000
    assert capped.bytes_read <= 30_000 and len(capped.files) == 30
    assert sum(capped.split_bytes(s) for s in SPLITS) <= 30_000 + 2 * 30  # the bytes plus the separators
    assert capped.digest != full.digest
    # files over max_file_bytes are left out
    mixed = tmp_path / "b"
    _tree(mixed, n=30, size=400)
    (mixed / "big.py").write_text("BIG = 1\n" * 1000)
    small = StdlibCorpus(CorpusConfig(max_file_bytes=500), tok, seq_len=16, root=mixed)
    assert len(small.files) == 30 and "big.py" not in {f.rel for f in small.files}
    with pytest.raises(ValueError, match="max_bytes"):
        StdlibCorpus(CorpusConfig(max_bytes=1024), tok, seq_len=16, root=root)


def test_byte_table_is_the_tokenizers_own_encoding():
    tok = build_char_tokenizer()
    table = byte_table(tok)
    text = "def f(x):\n\treturn 'é€😀' + x  # ~\r\n" + "".join(map(chr, range(32, 127)))
    assert table[torch.tensor(list(text.encode()))].tolist() == tok.encode(text, add_special_tokens=False)
    assert len(set(table.tolist())) == 256


def test_the_default_data_is_the_real_stdlib_held_out_by_file():
    d = DilocoConfig()
    assert d.data == "stdlib"
    c = build_corpus(d, build_char_tokenizer())
    info = c.describe()
    assert info["files"]["train"] > 500 and info["files"]["heldout"] > 50
    assert info["bytes"]["heldout"] > d.eval_seqs * d.seq_len
    assert 0.05 < info["bytes"]["heldout"] / sum(info["bytes"].values()) < 0.2
    assert len(info["digest"]) == 64
    ev = c.eval_batch(d.eval_seqs)
    assert ev.shape == (d.eval_seqs, d.seq_len)
    assert c.train_batch(0, 0, d.batch_size).shape == (d.batch_size, d.seq_len)
