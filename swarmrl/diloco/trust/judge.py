"""Judging DiLoCo contributions (pure math: no server, no network; the aggregator calls it).

Each contribution ``x_i`` is a worker's dequantized pseudo-gradient for the open round. Per contribution:

* ``norm``: ``||x_i||`` and ``norm_ratio = ||x_i|| / median_j ||x_j||``;
* ``agreement``: the ``ceil((n - 1) / 2)``-th largest cosine of ``x_i`` to the round's other contributions (the
  largest of two for n = 3, the median of three for n = 4): an honest contribution keeps an honest partner's
  cosine while at most ``floor((n - 1) / 2)`` are hostile; ``agreement_z = agreement * sqrt(d)`` for ``d``
  elements: the cosine of two unrelated vectors (one isotropic) has a standard deviation of ``1 / sqrt(d)``, so
  ``agreement_z`` says how many of those the agreement stands above chance;
* ``loss_change``: ``L(anchor - x_i) - L(anchor)`` on the aggregator's scoring batch (drawn from the training
  data with a seed the aggregator keeps secret until the round closes: no worker could choose or fit it), and
  ``loss_rise = loss_change / L(anchor)``;
* ``history_cosine``: the largest cosine of ``x_i`` to a vector remembered from the last ``history_rounds``
  earlier rounds (every well-formed contribution and every published update), estimated on a count sketch (a
  seeded bucket and sign per element, ``SKETCH_BUCKETS`` buckets: ~0.016 standard error for unrelated vectors).

Verdict rules (``Rules``; a contribution is condemned by the first that fires, in this order):

* ``replayed`` (closest remembered vector: a published update) / ``stale`` (a contribution): ``history_cosine >=
  replay_cosine`` and either a copy (``1 - history_cosine <= COPY_GAP``: fires at any count) or, with 3+
  contributions, ``1 - history_cosine <= replay_gap * (1 - median_j history_cosine_j)``. A threshold on the
  cosine alone is not safe: consecutive honest pseudo-gradients of one worker point the same way more and more as
  the learning rate decays (measured up to 0.996 on a tiny model, 0.59 at the 800-step default);
* relative rules, only with at least ``MIN_RELATIVE`` (3) contributions, so that a median means something:
  ``scaled``: ``norm_ratio > norm_ratio`` (or a non-finite norm); ``opposed``: ``agreement_z < min_agreement_z``
  (sign-flipped, random: no more related to the others than chance). A threshold on the cosine itself is not
  safe: honest agreement falls as a run goes on (below), and what chance gives depends on ``d``;
* ``harmful`` (absolute): ``loss_rise > max_loss_rise`` (or a non-finite loss). The loss change of one honest
  contribution on a 16-sequence batch is noisy once training slows, so no rule compares it with the round's
  median; the absolute margin (0.15 of the anchor's loss) only catches what wrecks the model. At 0.05 it slashed
  an honest worker at the 800-step default (a 5.2% rise on one round's batch: benchmarks/diloco/ATTACK_RESULTS.md).

The aggregate is the mean of the accepted contributions (optionally each clipped to the median norm of the
accepted); ``aggregate = "mean"`` (the unguarded baseline) averages every contribution and judges nobody.

Calibration (``benchmarks/diloco/judge_calibration.py --rounds 64`` over ``calibration.judged_rounds``) at the
previous default, ``DilocoConfig(inner_steps=50)`` (558,976 parameters: ``sqrt(d)`` = 747.6; stdlib corpus,
inner lr 1e-3, H = 50, the whole 3200-step schedule: 64 rounds), W = 4, each attack in rank 0's place, judged
with 4 and with 3 contributions, seed 0 (2,033 honest rows). Honest worst vs hostile best:

=================  ====================================  ===================================================
statistic          honest worst                          hostile best
=================  ====================================  ===================================================
norm_ratio         1.148  (rule: > 5)                    scale x100: 87.5
agreement          0.037, z 27.7 (round 62; rule:        sign flip: -0.041 (z -30.4); random: 0.0033 (z 2.45)
                   z < 8)
loss_rise          0.076 (round 19; rule: > 0.15)        scale: 4.33 (sign flip from 0.009: "opposed")
history_cosine     0.537 (rule: >= 0.95 and a copy or    stale, replay: 1.0000, gap ratio <= 2e-15
                   gap ratio <= 0.1); gap ratio min 0.851
=================  ====================================  ===================================================

0 of 2,033 honest rows condemned; every attack caught in every round it could be made (stale from round 2,
replay from round 1). **Agreement falls as the run goes on**: the honest minimum per round was 0.88 in round 0,
0.25 in round 9, 0.10-0.20 in rounds 11-27, 0.06-0.11 from round 28 on and 0.037 in round 62 (late
pseudo-gradients are mostly each worker's own batch noise). A fixed cosine threshold had to follow it down: 0.1
condemned 6 honest rows in round 28 of the 1600-step default's calibration, and the 0.04 that replaced it
condemned 8 in round 62 of this one. The rule is now relative to chance (``min_agreement_z = 8``): the honest
worst stands 3.5x above it, the random attack's best 3.3x below it, and a random vector's ``agreement_z`` is
about a standard normal, so the rule only needs calibrating again if honest work comes within 8 standard
deviations of chance. The honest loss rise reached half the ``harmful`` margin (0.076 of 0.15) in one round. The
H = 32 default (100 rounds; the table above was taken at H = 50) was checked on its honest swarm run (W = 4, 400
judged rows, ``benchmarks/diloco/ATTACK_RESULTS.md``): worst agreement 0.0369, z 27.6 (round 85), loss rise 0.070,
norm ratio 1.10, history cosine 0.50, nothing rejected: the margins above hold. The
800-step default (16 rounds, seeds 0 / 1) had honest worst agreement 0.194 / 0.201, loss rise 0.018 / 0.021. On
the tiny model of the tests (hidden 32, H = 5 or 10) honest history cosines reach 0.996 and the rules still hold
(tests/test_diloco_judge.py); on the 148k-parameter model of the previous scenario (12 rounds) the honest worst
agreement was 0.362 / 0.398 and loss rise 0.0042.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields

import torch

__all__ = ["SKETCH_BUCKETS", "MIN_RELATIVE", "COPY_GAP", "CountSketch", "History", "Rules", "Stats", "Verdict",
           "contribution_stats", "judge", "aggregate", "cosine"]

SKETCH_BUCKETS = 4096
MIN_RELATIVE = 3  # fewer contributions: no relative rule may condemn anyone
COPY_GAP = 1e-4  # 1 - cosine to a remembered vector at most this: a copy (a re-sent int8 vector: ~1e-7)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity in float64 (0.0 when either vector is zero)."""
    a64, b64 = a.double().reshape(-1), b.double().reshape(-1)
    na, nb = float(a64.norm()), float(b64.norm())
    if na == 0.0 or nb == 0.0 or not math.isfinite(na * nb):
        return 0.0
    return float(a64 @ b64) / (na * nb)


class CountSketch:
    """A linear sketch: ``s[h(i)] += sign(i) * x[i]`` with a seeded bucket ``h`` and sign per element, so
    inner products (and cosines) of sketches estimate those of the vectors."""

    def __init__(self, numel: int, buckets: int = SKETCH_BUCKETS, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(int(seed))
        self.numel, self.buckets = numel, buckets
        self.index = torch.randint(0, buckets, (numel,), generator=g, dtype=torch.int64)
        self.sign = torch.randint(0, 2, (numel,), generator=g, dtype=torch.int8).float().mul_(2).sub_(1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() != self.numel:
            raise ValueError(f"sketch of {self.numel} elements given {x.numel()}")
        out = torch.zeros(self.buckets, dtype=torch.float64)
        out.index_add_(0, self.index, (x.reshape(-1).double() * self.sign))
        return out


@dataclass
class History:
    """Sketches of the last ``rounds`` rounds: ``(round, kind, node_id, sketch)``, kind ``contribution`` or
    ``update`` (a published outer update; node_id "")."""

    rounds: int
    entries: deque = field(default_factory=deque)

    def add(self, round_no: int, kind: str, node_id: str, sketch: torch.Tensor) -> None:
        self.entries.append((round_no, kind, node_id, sketch))
        while self.entries and self.entries[0][0] <= round_no - self.rounds:
            self.entries.popleft()

    def closest(self, sketch: torch.Tensor, before_round: int) -> tuple[float, str, str, int]:
        """The largest cosine to a remembered sketch of an earlier round: (cosine, kind, node_id, round)."""
        best = (-1.0, "", "", -1)
        for r, kind, nid, s in self.entries:
            if r < before_round:
                c = cosine(sketch, s)
                if c > best[0]:
                    best = (c, kind, nid, r)
        return best


@dataclass(frozen=True)
class Rules:
    norm_ratio: float = 5.0  # scaled: norm above this times the round's median norm
    replay_cosine: float = 0.95  # replayed / stale: at least this similar to a remembered vector, and a copy
    replay_gap: float = 0.1  # or 10x closer to it (1 - cosine) than the round's median contribution
    min_agreement_z: float = 8.0  # opposed: the agreement (``_agreements``) times sqrt(elements) below this
    max_loss_rise: float = 0.15  # harmful: the loss at anchor - x rises by more than this fraction of the anchor's
    clip: bool = False  # clip each accepted contribution to the accepted median norm before averaging

    @classmethod
    def of(cls, trust: object) -> Rules:
        """The rules a ``TrustConfig`` (or anything with fields of these names) sets."""
        return cls(**{f.name: getattr(trust, f.name) for f in fields(cls)})


@dataclass
class Stats:
    node_id: str
    norm: float
    norm_ratio: float
    agreement: float
    agreement_z: float  # agreement * sqrt(elements): standard deviations of chance
    loss_change: float
    loss_rise: float  # loss_change / loss at the anchor
    history_cosine: float
    history_kind: str  # "contribution" / "update" / "" (nothing remembered)
    history_of: str  # the node (contribution) the closest remembered vector came from


@dataclass
class Verdict:
    node_id: str
    accepted: bool
    reason: str = ""


def _agreements(stacked: torch.Tensor) -> list[float]:
    """Per row: the ``ceil((n - 1) / 2)``-th largest cosine to the other rows (the max for n = 3, the median of
    three for n = 4): an honest row keeps an honest partner's cosine while at most ``floor((n - 1) / 2)`` rows are
    hostile; a hostile row passes only if that many others agree with it."""
    n = stacked.shape[0]
    if n < 2:
        return [1.0] * n
    x = stacked.double()
    norms = x.norm(dim=1).clamp_min(1e-300)
    gram = (x @ x.T) / norms[:, None] / norms[None, :]
    k = -(-(n - 1) // 2)
    out = []
    for i in range(n):
        others = torch.cat([gram[i, :i], gram[i, i + 1:]])
        out.append(float(others.sort(descending=True).values[k - 1]))
    return out


def contribution_stats(node_ids: Sequence[str], vectors: Sequence[torch.Tensor],
                       loss_at: Callable[[torch.Tensor], float] | None, anchor: torch.Tensor,
                       sketch: CountSketch, history: History, round_no: int) -> list[Stats]:
    """The statistics of each contribution (``loss_at(params) -> loss`` on the scoring batch; None: no loss
    statistics, they read 0)."""
    n = len(vectors)
    if n == 0:
        return []
    stacked = torch.stack([v.reshape(-1).float() for v in vectors])
    norms = [float(v.double().norm()) for v in stacked]
    med_norm = statistics.median(norms)
    agreement = _agreements(stacked)
    base = loss_at(anchor) if loss_at is not None else 0.0
    changes = [loss_at(anchor - stacked[i]) - base for i in range(n)] if loss_at is not None else [0.0] * n
    out = []
    for i in range(n):
        hc, kind, of, _ = history.closest(sketch(stacked[i]), round_no)
        rise = changes[i] / abs(base) if base else 0.0
        out.append(Stats(node_ids[i], norms[i], norms[i] / med_norm if med_norm > 0 else 0.0, agreement[i],
                         agreement[i] * math.sqrt(stacked.shape[1]), changes[i], rise, hc, kind, of))
    return out


def _is_copy(s: Stats, rules: Rules, relative: bool, median_gap: float) -> bool:
    """At least ``replay_cosine`` similar to a remembered vector, and either a copy (``1 - cosine <= COPY_GAP``)
    or (3+ contributions) ``replay_gap`` times closer to it than the round's median contribution is to its own."""
    gap = 1.0 - s.history_cosine
    if s.history_cosine < rules.replay_cosine:
        return False
    return gap <= COPY_GAP or (relative and gap <= rules.replay_gap * median_gap)


def _reason(s: Stats, rules: Rules, relative: bool, median_gap: float) -> str:
    if _is_copy(s, rules, relative, median_gap):
        what = "replayed" if s.history_kind == "update" else "stale"
        return f"{what}: cosine {s.history_cosine:.3f} to a remembered {s.history_kind}"
    if relative and (not math.isfinite(s.norm) or s.norm_ratio > rules.norm_ratio):
        return f"scaled: norm {s.norm:.4g} is {s.norm_ratio:.1f}x the round's median"
    if relative and s.agreement_z < rules.min_agreement_z:
        return (f"opposed: cosine {s.agreement:.4f} to the other contributions ({s.agreement_z:.1f} standard "
                f"deviations of chance)")
    if not math.isfinite(s.loss_change) or s.loss_rise > rules.max_loss_rise:
        return f"harmful: the loss rises by {s.loss_change:+.4f} ({100 * s.loss_rise:.1f}% of the anchor's)"
    return ""


def judge(stats: Sequence[Stats], rules: Rules) -> list[Verdict]:
    """A verdict per contribution (see the module docstring for the rules)."""
    relative = len(stats) >= MIN_RELATIVE
    median_gap = 1.0 - statistics.median(s.history_cosine for s in stats) if stats else 0.0
    out = []
    for s in stats:
        why = _reason(s, rules, relative, median_gap)
        out.append(Verdict(s.node_id, not why, why))
    return out


def aggregate(vectors: Sequence[torch.Tensor], clip: bool = False) -> torch.Tensor | None:
    """The mean of ``vectors`` (fp32; None when there are none); ``clip``: each scaled down to the median norm
    first."""
    if not vectors:
        return None
    stacked = torch.stack([v.reshape(-1).float() for v in vectors])
    if clip and len(vectors) > 1:
        norms = stacked.double().norm(dim=1)
        med = float(norms.median())
        factors = torch.clamp(med / norms.clamp_min(1e-30), max=1.0).float()
        stacked = stacked * factors[:, None]
    return stacked.mean(dim=0)
