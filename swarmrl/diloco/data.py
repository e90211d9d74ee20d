"""A small language-modelling corpus generated from the project's tasks (``data = "task"``; the default data is
the standard library's source, ``swarmrl.diloco.corpus``), and the eval losses both use.

Text is lines ``<prompt><answer>\\n`` from a registered task (default ``mul_add``: ``12*7+33=117``),
packed into fixed-length token sequences with the byte-level tokenizer. Training batches are drawn
from the task's train split with a seed derived from (seed, worker rank, step), so every worker
sees its own data stream and the DDP baseline sees exactly the same batches as DiLoCo. The
held-out eval set is a fixed batch packed from the task's held-out split (expressions never trained
on), identical for every worker and mode.
"""

from __future__ import annotations

import torch

from swarmrl.envs.base import Environment


def _lines(env: Environment, seed: int, n: int, split: str) -> str:
    return "".join(f"{t.prompt}{t.demonstration}\n" for t in env.sample(seed=seed, n=n, split=split))  # type: ignore[arg-type]


class PackedCorpus:
    def __init__(self, env: Environment, tokenizer, seq_len: int = 64, seed: int = 0) -> None:
        if seq_len < 8:
            raise ValueError("seq_len must be >= 8")
        self.env, self.tok, self.seq_len, self.seed = env, tokenizer, seq_len, seed
        sample = _lines(env, seed, 64, "train")
        self._chars_per_line = max(1.0, len(sample) / 64)

    def _pack(self, text_fn, n_seq: int) -> torch.Tensor:
        need = n_seq * self.seq_len
        n_lines = int(need / self._chars_per_line * 1.2) + 8
        ids: list[int] = []
        attempt = 0
        while len(ids) < need:
            ids = self.tok.encode(text_fn(n_lines, attempt), add_special_tokens=False)
            n_lines *= 2
            attempt += 1
        return torch.tensor(ids[:need], dtype=torch.long).view(n_seq, self.seq_len)

    def train_batch(self, rank: int, step: int, batch_size: int) -> torch.Tensor:
        """A [batch_size, seq_len] batch of token ids for worker ``rank`` at inner step ``step``."""
        base = (self.seed * 1_000_003 + rank) * 10_000_019 + step
        return self._pack(lambda n, a: _lines(self.env, base * 7 + a, n, "train"), batch_size)

    def eval_batch(self, n_seq: int = 32) -> torch.Tensor:
        return self._pack(lambda n, a: _lines(self.env, 12345 + self.seed + a, n, "heldout"), n_seq)


def answer_mask(batch: torch.Tensor, sep_id: int, eol_id: int) -> torch.Tensor:
    """True where a token is part of an answer: after a ``sep`` ('=') up to and including the ``eol``.

    Answers are determined by their prompt, unlike the random operands that make up most tokens,
    so the loss on them shows what the model learned without the operands' fixed entropy floor.
    """
    mask = torch.zeros_like(batch, dtype=torch.bool)
    for r in range(batch.shape[0]):
        inside = False
        for j, t in enumerate(batch[r].tolist()):
            if inside:
                mask[r, j] = True
                if t == eol_id:
                    inside = False
            elif t == sep_id:
                inside = True
    return mask


@torch.no_grad()
def masked_eval_loss(model, batch: torch.Tensor, mask: torch.Tensor, chunk: int = 16) -> float:
    """Mean next-token cross-entropy over the target positions where ``mask`` is True."""
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    total, count = 0.0, 0
    for i in range(0, batch.shape[0], chunk):
        x = batch[i: i + chunk].to(dev)
        logits = model(input_ids=x).logits[:, :-1].float()
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                               reduction="none")
        m = mask[i: i + chunk, 1:].reshape(-1).to(dev)
        total += float(ce[m].sum())
        count += int(m.sum())
    if was_training:
        model.train()
    return total / max(1, count)


@torch.no_grad()
def eval_loss(model, batch: torch.Tensor, chunk: int = 16) -> float:
    """Mean next-token cross-entropy over ``batch`` (model put back in its previous mode)."""
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    total, count = 0.0, 0
    for i in range(0, batch.shape[0], chunk):
        x = batch[i: i + chunk].to(dev)
        loss = model(input_ids=x, labels=x).loss
        n = x.shape[0] * (x.shape[1] - 1)
        total += float(loss) * n
        count += n
    if was_training:
        model.train()
    return total / max(1, count)


@torch.no_grad()
def eval_seq_losses(model, batch: torch.Tensor, chunk: int = 16) -> list[float]:
    """Each sequence's mean next-token cross-entropy (for a standard error over the eval sequences; ``eval_loss`` is
    their mean when every sequence has the same length)."""
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    out: list[float] = []
    for i in range(0, batch.shape[0], chunk):
        x = batch[i: i + chunk].to(dev)
        logits = model(input_ids=x).logits[:, :-1].float()
        ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
        out += ce.mean(dim=1).tolist()
    if was_training:
        model.train()
    return out
