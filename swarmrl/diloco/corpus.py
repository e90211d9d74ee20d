"""A text corpus every machine has offline: the running interpreter's standard library source.

Files: every ``*.py`` under ``sysconfig.get_paths()["stdlib"]``, outside ``site-packages`` / ``dist-packages``
(third-party code is not the standard library), up to ``max_file_bytes`` each. Each file goes to one split by a
stable hash of its relative path (sha256 of the POSIX path: the same on every machine with the same Python):
``heldout`` (``heldout_frac`` of the files), ``valid`` (``valid_frac``: files kept out of training too, for tuning)
and ``train`` (the rest). The files are read in the order of a second hash of their path until ``max_bytes`` would
be passed, so a cap keeps a uniform sample of files and memory stays bounded (the corpus is held as raw bytes, one
byte per token).

Tokens: the byte-level tokenizer of a fresh model (``swarmrl.models.build_char_tokenizer``), one token per byte;
the byte-to-id table is read from the tokenizer itself. Files are joined with a blank line between them.

Batches: ``train_batch(rank, step, batch_size)`` draws ``batch_size`` random windows of ``seq_len`` tokens from the
train split with a generator seeded by (seed, rank, step), as ``PackedCorpus.train_batch`` does: every run (DDP,
DiLoCo, a lone worker) gives worker r at step s the same windows. ``eval_batch(n)``: n windows evenly spaced over
the evaluation split (held-out unless ``eval_split = "valid"``), the same for every run and worker.

``digest``: sha256 over (relative path, size, sha256 of the content) of every file read, in order, with the split
it went to and the Python version: what a figure names as its data.
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from swarmrl.diloco.config import CorpusConfig

SPLITS = ("train", "valid", "heldout")
SEPARATOR = b"\n\n"
_EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def _unit(key: str) -> float:
    """A stable number in [0, 1) from ``key`` (the first 8 bytes of its sha256)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2.0**64


def split_of(rel: str, heldout_frac: float, valid_frac: float) -> str:
    """The split of the file at relative path ``rel``: by a hash of the path only, never of its content."""
    u = _unit("split:" + rel)
    if u < heldout_frac:
        return "heldout"
    if u < heldout_frac + valid_frac:
        return "valid"
    return "train"


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def stdlib_files(root: Path) -> list[str]:
    """Relative POSIX paths of the standard library's ``*.py`` files under ``root``, sorted."""
    rels = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root)
        if _EXCLUDED_DIRS & set(rel.parts[:-1]) or not p.is_file():
            continue
        rels.append(rel.as_posix())
    return sorted(rels)


def byte_table(tokenizer) -> torch.Tensor:
    """The token id of each byte value under a byte-level tokenizer (GPT-2's byte-to-character map)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    ids = [tokenizer.convert_tokens_to_ids(chars[b]) for b in range(256)]
    unk = getattr(tokenizer, "unk_token_id", None)
    if any(i is None or i == unk for i in ids) or len(set(ids)) != 256:
        raise ValueError("the tokenizer is not byte-level: not every byte has its own token")
    return torch.tensor(ids, dtype=torch.long)


@dataclass(frozen=True)
class CorpusFile:
    rel: str
    size: int
    sha256: str
    split: str


class StdlibCorpus:
    """The standard library's source as a byte-level language-modelling corpus (see the module docstring)."""

    def __init__(self, cfg: CorpusConfig, tokenizer, seq_len: int = 64, seed: int = 0,
                 root: str | Path | None = None) -> None:
        if seq_len < 8:
            raise ValueError("seq_len must be >= 8")
        self.cfg, self.seq_len, self.seed = cfg, seq_len, seed
        self.root = Path(root).resolve() if root is not None else stdlib_root()
        self.table = byte_table(tokenizer)
        self.files: list[CorpusFile] = []
        parts: dict[str, list[bytes]] = {s: [] for s in SPLITS}
        total = 0
        for rel in sorted(stdlib_files(self.root), key=lambda r: _unit("order:" + r)):
            path = self.root / rel
            size = path.stat().st_size
            if size == 0 or size > cfg.max_file_bytes:
                continue
            if total + size > cfg.max_bytes:
                continue  # a smaller file further on may still fit
            data = path.read_bytes()[: cfg.max_file_bytes]
            split = split_of(rel, cfg.heldout_frac, cfg.valid_frac)
            self.files.append(CorpusFile(rel, len(data), hashlib.sha256(data).hexdigest(), split))
            parts[split].append(data)
            total += len(data)
        self.bytes_read = total
        self._data = {s: np.frombuffer(SEPARATOR.join(parts[s]), dtype=np.uint8) for s in SPLITS}
        for s in ("train", cfg.eval_split):
            if self._data[s].size < seq_len + 1:
                raise ValueError(f"the {s} split holds {self._data[s].size} bytes: fewer than one window of "
                                 f"{seq_len}; raise corpus.max_bytes")
        h = hashlib.sha256(f"stdlib python {sys.version_info[0]}.{sys.version_info[1]}\n".encode())
        for f in self.files:
            h.update(f"{f.rel}\t{f.size}\t{f.sha256}\t{f.split}\n".encode())
        self.digest = h.hexdigest()

    def split_bytes(self, split: str) -> int:
        return int(self._data[split].size)

    def _windows(self, split: str, starts: np.ndarray) -> torch.Tensor:
        data = self._data[split]
        idx = starts[:, None] + np.arange(self.seq_len)[None, :]
        return self.table[torch.from_numpy(data[idx].astype(np.int64))]

    def train_batch(self, rank: int, step: int, batch_size: int) -> torch.Tensor:
        """A [batch_size, seq_len] batch of token ids for worker ``rank`` at inner step ``step``."""
        base = (self.seed * 1_000_003 + rank) * 10_000_019 + step
        g = np.random.default_rng([base & (2**63 - 1), 0x5EED])
        starts = g.integers(0, self._data["train"].size - self.seq_len + 1, size=batch_size)
        return self._windows("train", starts)

    def eval_batch(self, n_seq: int = 32) -> torch.Tensor:
        """``n_seq`` windows evenly spaced over the evaluation split (``cfg.eval_split``): fixed for every run."""
        n = self._data[self.cfg.eval_split].size
        starts = np.linspace(0, n - self.seq_len, num=n_seq).astype(np.int64)
        return self._windows(self.cfg.eval_split, starts)

    def describe(self) -> dict:
        """What a summary reports about the data: its digest, the files and bytes per split."""
        return {
            "source": "stdlib", "digest": self.digest, "root": str(self.root),
            "python": f"{sys.version_info[0]}.{sys.version_info[1]}.{sys.version_info[2]}",
            "files": {s: sum(1 for f in self.files if f.split == s) for s in SPLITS},
            "bytes": {s: sum(f.size for f in self.files if f.split == s) for s in SPLITS},
            "eval_split": self.cfg.eval_split,
        }


def build_corpus(cfg, tokenizer):
    """The training data a ``DilocoConfig`` names: the stdlib corpus, or text generated from ``cfg.task``."""
    if cfg.data == "stdlib":
        return StdlibCorpus(cfg.corpus, tokenizer, seq_len=cfg.seq_len, seed=cfg.seed)
    from swarmrl.diloco.data import PackedCorpus  # noqa: PLC0415

    return PackedCorpus(cfg.task.build(), tokenizer, seq_len=cfg.seq_len, seed=cfg.seed)


def describe(corpus, cfg) -> dict:
    """The summary's ``data`` entry: the stdlib corpus's digest and split sizes, or the task that generated it."""
    if isinstance(corpus, StdlibCorpus):
        return corpus.describe()
    return {"source": "task", "task": cfg.task.model_dump()}
