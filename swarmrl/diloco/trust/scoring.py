"""The aggregator's copy of the model, for scoring contributions: the loss at the anchor minus a pseudo-gradient on
a batch drawn from the training data with the aggregator's secret seed (no server imports).

``build_parts`` builds the model, tokenizer and corpus exactly as a DiLoCo worker does (``swarmrl.diloco.worker``),
so the aggregator's anchor at round 0 is the workers' and its scoring batches come from the data they train on.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from swarmrl.diloco.config import DilocoConfig
from swarmrl.diloco.corpus import build_corpus
from swarmrl.diloco.data import eval_loss
from swarmrl.diloco.outer import flatten, unflatten_into
from swarmrl.training.model import build_model, prepare_model

__all__ = ["build_parts", "ScoringModel"]


def build_parts(cfg: DilocoConfig) -> tuple[torch.nn.Module, object, object]:
    """(model, tokenizer, corpus) as a worker builds them: a fresh model from ``cfg.init`` (the same seed on every
    party: identical start) and the packed training corpus."""
    model, tok = build_model(None, cfg.init)
    prepare_model(model)
    corpus = build_corpus(cfg, tok)  # the worker's data: the stdlib source (default) or a task's text
    return model, tok, corpus


class ScoringModel:
    """A model whose parameters are set from a flat vector to score it on a batch (CPU, eval mode)."""

    def __init__(self, cfg: DilocoConfig) -> None:
        self.model, self.tok, self.corpus = build_parts(cfg)
        self.model.eval()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.numel = sum(p.numel() for p in self.params)
        self.eval_batch = self.corpus.eval_batch(cfg.eval_seqs)

    def initial(self) -> torch.Tensor:
        """The freshly built parameters (the run's round-0 anchor), flat fp32."""
        return flatten(self.params)

    def batch(self, secret: int, round_no: int, n: int) -> torch.Tensor:
        """A scoring batch of ``n`` training sequences: the corpus's stream for the pseudo-rank ``secret`` at
        step ``round_no`` (``secret`` drawn at random by the aggregator per round; workers use ranks < 64)."""
        return self.corpus.train_batch(int(secret), int(round_no), int(n))

    def loss_fn(self, batch: torch.Tensor) -> Callable[[torch.Tensor], float]:
        def loss_at(flat: torch.Tensor) -> float:
            unflatten_into(flat, self.params)
            return eval_loss(self.model, batch)
        return loss_at
