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
def token_losses(model, batch: torch.Tensor, chunk: int = 16) -> torch.Tensor:
    """Next-token cross-entropy at every target position: ``[n_seq, seq_len - 1]`` float32 on the CPU, in ``chunk``
    sequences a forward pass (the model put back in its previous mode). The evaluation functions below reduce it."""
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    out = []
    try:
        for i in range(0, batch.shape[0], chunk):
            x = batch[i: i + chunk].to(dev)
            logits = model(input_ids=x).logits[:, :-1].float()
            out.append(torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none").cpu())
    finally:
        if was_training:
            model.train()
    return torch.cat(out) if out else torch.zeros(0, max(0, batch.shape[1] - 1))


def masked_mean(ce: torch.Tensor, mask: torch.Tensor) -> float:
    """The mean of ``token_losses`` over the target positions where ``mask`` (over the input, ``[n_seq, seq_len]``)
    is True."""
    m = mask[:, 1:].bool()
    return float(ce[m].double().sum()) / max(1, int(m.sum()))


def seq_losses(ce: torch.Tensor) -> list[float]:
    """Each sequence's mean loss from ``token_losses``."""
    return ce.double().mean(dim=1).tolist()


def mean_loss(ce: torch.Tensor) -> float:
    """The mean over every target position of ``token_losses`` (float64 accumulation)."""
    return float(ce.double().mean()) if ce.numel() else 0.0


def eval_loss(model, batch: torch.Tensor, chunk: int = 16) -> float:
    """Mean next-token cross-entropy over ``batch``."""
    return mean_loss(token_losses(model, batch, chunk))
