"""Checking untrusted TOPLOC proofs against hidden states the verifier recomputed itself.

Every proof is hostile until decoded: wrong type, length, modulus, coefficient range, a null proof or
a proof count different from the chunk count gives ``ChunkCheck(passed=False, reason=...)``; no
exception about the proofs ever reaches the caller. Metrics follow the spec: for the verifier's OWN
top-k indices j, claimed = P(j mod m) read as bf16 bits vs its own bits; exponent mismatches are
counted, mantissa errors |f_claimed - f_mine| over agreeing exponents give a mean and an upper median
(2^64 for both when no exponent agrees).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from pydantic import Field

from swarmrl.config import StrictModel
from swarmrl.contract.params import PROOF_GEOMETRY, ProofGeometry
from swarmrl.toploc.proof import ProofError, chunk_bits, chunk_count, decode_proof, evaluate, topk_indices

__all__ = ["Thresholds", "ChunkCheck", "verify_proofs", "verify_proofs_batch", "NO_AGREEMENT"]

NO_AGREEMENT = float(2**64)
MAX_PROOFS = 1 << 16  # more proofs than this in one call is rejected before looking at them


class Thresholds(StrictModel):
    """A chunk fails if any bound is exceeded (published defaults for k = 128)."""

    max_exp_mismatches: int = Field(38, ge=0)
    max_mant_err_mean: float = Field(10.0, ge=0)
    max_mant_err_median: float = Field(8.0, ge=0)


@dataclass
class ChunkCheck:
    index: int
    passed: bool
    exp_mismatches: int = -1  # -1: not evaluated (proof rejected)
    mant_err_mean: float = NO_AGREEMENT
    mant_err_median: float = NO_AGREEMENT
    reason: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _reject_all(n: int, reason: str) -> list[ChunkCheck]:
    return [ChunkCheck(i, False, reason=reason) for i in range(n)]


def compare_bits(claimed: np.ndarray, mine: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-row (exp_mismatches, mant_err_mean, mant_err_median) of two [C, n] bit-pattern arrays."""
    claimed = claimed.astype(np.int64)
    mine = mine.astype(np.int64)
    e_c, e_m = (claimed >> 7) & 0xFF, (mine >> 7) & 0xFF
    f_c, f_m = claimed & 0x7F, mine & 0x7F
    agree = e_c == e_m
    n_agree = agree.sum(axis=1)
    exp_mis = claimed.shape[1] - n_agree
    err = np.abs(f_c - f_m)
    tot = np.where(agree, err, 0).sum(axis=1)
    srt = np.sort(np.where(agree, err, 1 << 20), axis=1)
    safe = np.maximum(n_agree, 1)
    mean = np.where(n_agree > 0, tot / safe, NO_AGREEMENT)
    med_idx = np.minimum(n_agree // 2, claimed.shape[1] - 1)
    median = np.where(n_agree > 0, np.take_along_axis(srt, med_idx[:, None], axis=1)[:, 0].astype(np.float64),
                      NO_AGREEMENT)
    return exp_mis, mean, median


def verify_proofs(hidden: torch.Tensor, proofs: object, geometry: ProofGeometry = PROOF_GEOMETRY,
                  thresholds: Thresholds | None = None) -> list[ChunkCheck]:
    """Check ``proofs`` (untrusted) against the verifier's own ``hidden`` [positions, hidden] states.

    Returns one ChunkCheck per chunk of ``hidden``; hostile proofs give failed checks with reasons.
    """
    return verify_proofs_batch([(hidden, proofs)], geometry, thresholds=thresholds)[0]


def _precheck(hidden: torch.Tensor, proofs: object, chunk: int, k: int) -> tuple[list, list, int] | list[ChunkCheck]:
    """Decoded proofs and pre-filled checks (None = still to compare) of one sequence, or all its checks failed."""
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be [positions, hidden], got shape {tuple(hidden.shape)}")
    n_chunks = chunk_count(hidden.shape[0], chunk)
    if not isinstance(proofs, (list, tuple)):
        return _reject_all(n_chunks, f"proofs must be a list, got {type(proofs).__name__}")
    if len(proofs) > MAX_PROOFS:
        return _reject_all(n_chunks, f"{len(proofs)} proofs is over the {MAX_PROOFS} limit")
    if len(proofs) != n_chunks:
        return _reject_all(n_chunks, f"{len(proofs)} proofs for {n_chunks} chunks")
    decoded: list = []
    checks: list[ChunkCheck | None] = []
    for i, raw in enumerate(proofs):
        try:
            decoded.append(decode_proof(raw, k))
            checks.append(None)
        except ProofError as e:
            decoded.append(None)
            checks.append(ChunkCheck(i, False, reason=f"proof {i} rejected: {e}"))
    return decoded, checks, n_chunks


def verify_proofs_batch(items: list[tuple[torch.Tensor, object]], geometry: ProofGeometry = PROOF_GEOMETRY,
                        thresholds: Thresholds | None = None) -> list[list[ChunkCheck]]:
    """``verify_proofs`` for many sequences at once: chunks of equal width from every sequence are compared
    in one vectorised pass (top-k, polynomial evaluation, bit comparison), which is what makes a validator's
    check of a whole submission cheap. Each item's result is what ``verify_proofs`` gives for it alone."""
    th = thresholds or Thresholds()
    chunk, k = geometry.chunk, geometry.k
    results: list[list] = []
    # width -> blocks of chunk rows to compare: (bits [r, width], item, chunk index of each row, decoded proofs)
    by_width: dict[int, list[tuple[np.ndarray, int, list[int], list]]] = {}
    for it, (hidden, proofs) in enumerate(items):
        pre = _precheck(hidden, proofs, chunk, k)
        if isinstance(pre, list):
            results.append(pre)
            continue
        decoded, checks, _ = pre
        results.append(checks)
        base = 0
        for bits in chunk_bits(hidden, chunk):
            rows = [r for r in range(bits.shape[0]) if decoded[base + r] is not None]
            if rows:
                block = bits.numpy()
                if len(rows) < block.shape[0]:
                    block = block[rows]
                by_width.setdefault(bits.shape[1], []).append(
                    (block, it, [base + r for r in rows], [decoded[base + r] for r in rows]))
            base += bits.shape[0]
    for blocks in by_width.values():
        # one block (a single sequence with every proof well-formed) is compared in place, without a copy
        sub = blocks[0][0] if len(blocks) == 1 else np.concatenate([b[0] for b in blocks], axis=0)
        entries = [(it, ci) for _, it, cis, _ in blocks for ci in cis]
        try:
            found = _compare(sub, [d for b in blocks for d in b[3]], k, th)
        except Exception as e:  # defensive: a proof must never crash the verifier
            found = [(False, -1, NO_AGREEMENT, NO_AGREEMENT,
                      f"could not be checked: {type(e).__name__}: {e}")] * len(entries)
        for (it, ci), (ok, e_mis, mu, md, why) in zip(entries, found):
            if e_mis < 0:
                results[it][ci] = ChunkCheck(ci, False, reason=f"proof {ci} {why}")
            else:
                results[it][ci] = ChunkCheck(ci, ok, e_mis, mu, md, why)
    assert all(ch is not None for res in results for ch in res)
    return results


def _compare(sub: np.ndarray, decoded: list, k: int, th: Thresholds
             ) -> list[tuple[bool, int, float, float, str | None]]:
    """Rows of chunk bit patterns [R, n] against their decoded proofs: (passed, exp_mismatches, mean, median, why)."""
    ke = min(k, sub.shape[1])
    idx = topk_indices(sub, ke)
    mine = np.take_along_axis(sub, idx, axis=1).astype(np.int64) & 0xFFFF
    m = np.array([d.m for d in decoded], dtype=np.int64)
    coeffs = np.stack([d.coeffs for d in decoded])
    claimed = evaluate(coeffs, idx % m[:, None])
    exp_mis, mean, median = compare_bits(claimed, mine)
    out = []
    for j in range(len(decoded)):
        e, mu, md = int(exp_mis[j]), float(mean[j]), float(median[j])
        why = []
        if e > th.max_exp_mismatches:
            why.append(f"exp_mismatches {e} > {th.max_exp_mismatches}")
        if mu > th.max_mant_err_mean:
            why.append(f"mant_err_mean {mu:.3g} > {th.max_mant_err_mean}")
        if md > th.max_mant_err_median:
            why.append(f"mant_err_median {md:.3g} > {th.max_mant_err_median}")
        out.append((not why, e, mu, md, "; ".join(why) or None))
    return out
