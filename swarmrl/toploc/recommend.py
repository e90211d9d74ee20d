"""Choosing a model's TOPLOC thresholds from what a calibration saw: honest chunks vs one-token edits.

A chunk fails when ``exp_mismatches > te``, ``mant_err_mean > tm`` or ``mant_err_median > td``; a rollout passes
when every chunk passes. Two bounds frame the choice:

- the honest maxima H (the tightest thresholds no honest rollout seen fails), and
- the margin-based thresholds R = H x margin + slack (``margin_thresholds``: room for honest noise not seen).

Within [H, R] (per metric) the recommendation lets the fewest one-token edits pass on proofs alone and, among
those, is the max-margin separator: it maximises the smaller of the room above the honest maxima (the smallest
normalised slack ``(t - H) / (R - H)`` over the three metrics) and the room below the edits (for each caught
edit, how far its most deviating chunk metric is past its threshold, normalised the same way; the smallest
over the edits), so a threshold sits halfway between the honest maxima and the nearest edit that only it
catches, not right under that edit. When even H lets edits pass, the distributions overlap: no threshold
separates them, and ``separable`` is False.
An edit of a completion's LAST token changes no committed state (the state of token i is the LM-head input
that predicted it), so it is invisible to proofs at any threshold: callers leave those out of ``edits``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from swarmrl.toploc.verify import Thresholds

__all__ = ["ChunkMetrics", "Recommendation", "margin_thresholds", "recommend", "rollout_passes"]

ChunkMetrics = tuple[int, float, float]  # (exp_mismatches, mant_err_mean, mant_err_median) of one chunk
MAX_CANDIDATES = 60  # lowest observed values per metric used for the search grid


def margin_thresholds(honest_max: ChunkMetrics, margin: float) -> Thresholds:
    """Honest max x margin + slack (2 exponent mismatches, 1.0 mean, 1 median)."""
    e, mean, med = honest_max
    return Thresholds(max_exp_mismatches=int(math.ceil(e * margin)) + 2,
                      max_mant_err_mean=round(mean * margin + 1.0, 3),
                      max_mant_err_median=float(math.ceil(med * margin)) + 1.0)


def rollout_passes(chunks: Sequence[ChunkMetrics], th: Thresholds) -> bool:
    return all(e <= th.max_exp_mismatches and m <= th.max_mant_err_mean and d <= th.max_mant_err_median
               for e, m, d in chunks)


@dataclass
class Recommendation:
    thresholds: Thresholds
    margin_based: Thresholds
    honest_max: ChunkMetrics
    honest_rollouts: int
    honest_chunks: int
    edits: int  # one-token edits considered (with at least one changed committed state)
    edits_passing: int  # of those, passing on proofs alone with ``thresholds``
    edits_passing_margin: int  # ... with ``margin_based``
    edits_passing_at_honest_max: int  # ... with the honest maxima: > 0 means the distributions overlap
    honest_failing: int  # honest rollouts failing ``thresholds`` (0 by construction)
    separable: bool
    note: str

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["thresholds"], d["margin_based"] = self.thresholds.model_dump(), self.margin_based.model_dump()
        d["honest_max"] = list(self.honest_max)
        return d


def _candidates(lo: float, hi: float, values: np.ndarray) -> np.ndarray:
    """lo, hi, and inside (lo, hi] the midpoints between lo and each observed value and between neighbouring
    observed values (the lowest ones kept when there are many: the nearest to the honest side matter)."""
    inside = np.unique(values[(values > lo) & (values <= hi)])[:MAX_CANDIDATES]
    pts = np.concatenate([[lo], inside])
    mids = (pts[:-1] + pts[1:]) / 2 if len(pts) > 1 else np.array([])
    return np.unique(np.concatenate([[lo, hi], (lo + inside) / 2, mids]))


def _up(x: float) -> float:
    """Rounded up to 4 decimals (never below the honest value it came from)."""
    return math.ceil(x * 1e4 - 1e-9) / 1e4


def recommend(honest: Sequence[Sequence[ChunkMetrics]], edits: Sequence[Sequence[ChunkMetrics]],
              margin: float) -> Recommendation:
    """Thresholds separating ``honest`` rollouts (lists of chunk metrics) from one-token ``edits``."""
    hc = [c for r in honest for c in r]
    hmax: ChunkMetrics = (max((c[0] for c in hc), default=0), max((c[1] for c in hc), default=0.0),
                          max((c[2] for c in hc), default=0.0))
    R = margin_thresholds(hmax, margin)
    H = Thresholds(max_exp_mismatches=hmax[0], max_mant_err_mean=hmax[1], max_mant_err_median=hmax[2])

    def passing(th: Thresholds) -> int:
        return sum(rollout_passes(r, th) for r in edits)

    edits = [r for r in edits if len(r)]
    best = R
    if edits:
        chunks = np.array([c for r in edits for c in r], dtype=np.float64).reshape(-1, 3)
        starts = np.cumsum([0] + [len(r) for r in edits[:-1]])  # each rollout's chunks are contiguous
        lo = np.array([hmax[0], hmax[1], hmax[2]], dtype=np.float64)
        hi = np.array([R.max_exp_mismatches, R.max_mant_err_mean, R.max_mant_err_median], dtype=np.float64)
        width = np.maximum(hi - lo, 1e-12)
        z = (chunks - lo) / width  # every metric in units of its [H, R] width, 0 at the honest maximum
        cm = _candidates(lo[1], hi[1], chunks[:, 1])
        cd = _candidates(lo[2], hi[2], chunks[:, 2])
        sm, sd = (cm - lo[1]) / width[1], (cd - lo[2]) / width[2]  # honest slack of each candidate
        past_m = z[None, :, 1] - sm[:, None]  # [A, n]: how far each chunk's mean is past each candidate
        past_d = z[None, :, 2] - sd[:, None]  # [B, n]
        key_best: tuple | None = None
        for te in range(int(lo[0]), int(hi[0]) + 1):
            se = (te - lo[0]) / width[0]
            past = np.maximum(np.maximum(past_m[:, None, :], past_d[None, :, :]), (z[:, 0] - se)[None, None, :])
            reach = np.maximum.reduceat(past, starts, axis=2)  # [A, B, rollouts]: > 0 = caught
            n_pass = (reach <= 0).sum(-1)
            hs = np.minimum(np.minimum(sm[:, None], sd[None, :]), se)  # room above honest
            sep = np.minimum(hs, np.where(reach > 0, reach, np.inf).min(-1))  # ... and below the nearest caught edit
            sums = sm[:, None] + sd[None, :] + se
            i = np.lexsort((-sums.ravel(), -hs.ravel(), -sep.ravel(), n_pass.ravel()))[0]
            a, b = np.unravel_index(i, n_pass.shape)
            key = (int(n_pass[a, b]), -float(sep[a, b]), -float(hs[a, b]), -float(sums[a, b]))
            if key_best is None or key < key_best:
                key_best = key
                best = Thresholds(max_exp_mismatches=te, max_mant_err_mean=_up(float(cm[a])),
                                  max_mant_err_median=_up(float(cd[b])))
    at_h, at_best, at_r = passing(H), passing(best), passing(R)
    honest_fail = sum(not rollout_passes(r, best) for r in honest)
    if not edits:
        note = "no one-token edit with a changed committed state was seen: the margin-based thresholds"
    elif at_h:
        note = (f"the distributions overlap: {at_h}/{len(edits)} one-token edits pass even at the honest maxima "
                f"{hmax}; the recommendation lets the fewest ({at_best}) pass with the most room above them")
    elif at_r:
        note = (f"honest max x {margin} + slack would let {at_r}/{len(edits)} edits pass: tightened within "
                f"[honest max, that] to the thresholds halfway between honest and the nearest edits")
    else:
        note = (f"every edit is caught within [honest max, honest max x {margin} + slack]: thresholds halfway "
                f"between honest and the nearest edits")
    return Recommendation(best, R, hmax, len(honest), len(hc), len(edits), at_best, at_r, at_h, honest_fail,
                          bool(edits) and at_h == 0, note)
