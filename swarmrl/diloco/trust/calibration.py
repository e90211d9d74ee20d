"""Honest pseudo-gradients and the five attacks, in process, for calibrating and testing the judge (no server).

``honest_rounds`` runs ``workers`` ranks of H inner AdamW steps (the worker's builders: model, corpus, optimiser,
schedule) from a shared anchor, round after round, the outer Nesterov step applying the int8-published mean of
their int8 uploads, as the swarm backend does. ``attack_vector`` makes what a hostile rank 0 sends instead:
sign-flipped, scaled (x100), random with its norm, stale (its own pseudo-gradient of 2 rounds ago), replayed (the
previous round's published update).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from swarmrl.diloco.config import DilocoConfig
from swarmrl.diloco.outer import OuterNesterov, flatten, pseudo_gradient, unflatten_into
from swarmrl.diloco.trust import wire
from swarmrl.diloco.trust.judge import CountSketch, History, Rules, Stats, Verdict, contribution_stats, judge
from swarmrl.diloco.trust.scoring import ScoringModel, build_parts
from swarmrl.training.optim import build_optimizer, clip_gradients
from swarmrl.training.schedule import build_scheduler

ATTACKS = ("sign_flip", "scale", "random", "stale", "replay")


def int8_roundtrip(x: torch.Tensor, chunk: int) -> torch.Tensor:
    """What the aggregator reads of an upload of ``x``: ``x`` through the int8 wire."""
    return wire.dequantize(*wire.quantize(x, chunk), chunk)


class Rank:
    """One worker's inner loop (its own AdamW state and schedule across rounds, as a DiLoCo worker keeps them)."""

    def __init__(self, cfg: DilocoConfig, rank: int) -> None:
        self.cfg, self.rank = cfg, rank
        self.model, self.tok, self.corpus = build_parts(cfg)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = build_optimizer(self.params, cfg.inner_lr, cfg.betas, cfg.weight_decay, fused=False)
        self.sched = build_scheduler(self.opt, cfg.warmup_steps, cfg.total_steps, cfg.min_lr_ratio)
        self.step = 0

    def inner(self, anchor: torch.Tensor, steps: int) -> torch.Tensor:
        """``steps`` AdamW steps from ``anchor``; the pseudo-gradient (anchor minus the parameters reached)."""
        unflatten_into(anchor, self.params)
        self.model.train()
        for _ in range(steps):
            x = self.corpus.train_batch(self.rank, self.step, self.cfg.batch_size)
            loss = self.model(input_ids=x, labels=x).loss
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            clip_gradients(self.params, self.opt, self.cfg.grad_clip)
            self.opt.step()
            self.sched.step()
            self.step += 1
        return pseudo_gradient(anchor, flatten(self.params))


@dataclass
class HonestRound:
    round: int
    anchor: torch.Tensor  # the round's anchor (every rank started from it)
    pgs: list[torch.Tensor]  # each rank's upload as the aggregator reads it (int8 round trip)
    update: torch.Tensor  # the published update (int8 round trip of the mean), applied after this round
    own0: list[torch.Tensor]  # rank 0's uploads so far (this round's last)
    updates: list[torch.Tensor]  # the published updates before this round


def honest_rounds(cfg: DilocoConfig, workers: int, rounds: int, steps: int | None = None) -> Iterator[HonestRound]:
    """``rounds`` honest rounds of ``workers`` ranks (``steps`` inner steps each, default H)."""
    ranks = [Rank(cfg, r) for r in range(workers)]
    outer = OuterNesterov(flatten(ranks[0].params), lr=cfg.outer_lr, momentum=cfg.outer_momentum)
    own0: list[torch.Tensor] = []
    updates: list[torch.Tensor] = []
    for rnd in range(rounds):
        anchor = outer.anchor.clone()
        pgs = [int8_roundtrip(rk.inner(anchor, steps or cfg.inner_steps), cfg.int8_chunk) for rk in ranks]
        own0.append(pgs[0])
        update = int8_roundtrip(torch.stack(pgs).mean(0), cfg.int8_chunk)
        yield HonestRound(rnd, anchor, pgs, update, list(own0), list(updates))
        updates.append(update)
        outer.step(update)


def attack_vector(kind: str, r: HonestRound, gen: torch.Generator, scale: float = 100.0) -> torch.Tensor | None:
    """What a hostile rank 0 uploads in round ``r`` (None: the attack has nothing to send yet)."""
    own = r.pgs[0]
    if kind == "sign_flip":
        return -own
    if kind == "scale":
        return own * scale
    if kind == "random":
        x = torch.randn(own.numel(), generator=gen)
        return x * (own.norm() / x.norm())
    if kind == "stale":
        return r.own0[-3] if len(r.own0) >= 3 else None
    if kind == "replay":
        return r.updates[-1] if r.updates else None
    raise ValueError(f"unknown attack {kind!r}")


@dataclass
class JudgedCase:
    """One case of a round judged: ``case`` is "honest" or the attack in rank 0's place; ``n`` contributions."""

    case: str
    n: int
    stats: list[Stats]
    verdicts: list[Verdict]


def judged_rounds(cfg: DilocoConfig, scorer: ScoringModel, workers: int, rounds: int, counts: Sequence[int],
                  score_seed: Callable[[int], int], steps: int | None = None, sketch_seed: int = 1234,
                  attack_seed: int = 7) -> Iterator[tuple[HonestRound, list[JudgedCase]]]:
    """Per honest round, the judge's statistics and verdicts for the honest uploads and for each attack in rank 0's
    place, with the first ``n`` contributions for each ``n`` in ``counts``; the scoring batch of round ``k`` is drawn
    with seed ``score_seed(k)``. Ranks are named ``rank0``...; the round's uploads and update are remembered (the
    judge's history) once the caller asks for the next round."""
    t = cfg.trust
    rules = Rules.of(t)
    sketch, history = CountSketch(scorer.numel, seed=sketch_seed), History(t.history_rounds)
    gen = torch.Generator().manual_seed(attack_seed)
    ids = [f"rank{r}" for r in range(workers)]
    for r in honest_rounds(cfg, workers, rounds, steps=steps):
        loss_at = scorer.loss_fn(scorer.batch(score_seed(r.round), r.round, t.score_seqs))
        cases = {"honest": r.pgs}
        for kind in ATTACKS:
            v = attack_vector(kind, r, gen)
            if v is not None:
                cases[kind] = [int8_roundtrip(v, cfg.int8_chunk)] + r.pgs[1:]
        judged = []
        for case, vecs in cases.items():
            for n in counts:
                stats = contribution_stats(ids[:n], vecs[:n], loss_at, r.anchor, sketch, history, r.round)
                judged.append(JudgedCase(case, n, stats, judge(stats, rules)))
        yield r, judged
        for i, v in zip(ids, r.pgs):
            history.add(r.round, "contribution", i, sketch(v))
        history.add(r.round, "update", "", sketch(r.update))
