"""TOPLOC proof math: top-k selection, index modulus, interpolation over GF(65497), encode/decode, eval.

Pure math on tensors/arrays (no model code, no servers). The byte format is the wire contract of
``shared/specs/toploc-proof-format.md``:

    u16 big-endian m, then k x u16 big-endian coefficients c_0..c_{k-1} (ascending powers)

Everything is vectorised over chunks: top-k uses a group-max prefilter (two read-only reductions),
the interpolation is Newton's divided differences done for all chunks at once with int64 numpy
ops and a precomputed table of inverses mod p, and evaluation is baby-step giant-step
over [chunks, k] arrays (a batched float64 matmul between two short loops of modular products).

Top-k tie rule (documented, deterministic): the k flat indices with the largest |value|, where
|value| is ordered by the bf16 bit pattern with the sign cleared (so NaN > inf > finite); among
equal magnitudes the LOWER flat index wins. A verifier never depends on this rule: it takes its own
top-k and compares values, so ties only matter through the thresholds.

Chunks with fewer than k values (a short last chunk of a small model) commit to all their values;
the polynomial then has degree < n and the leading coefficients are zero, still 2 + 2k bytes.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

import numpy as np
import torch

from swarmrl.contract.params import PROOF_GEOMETRY, ProofGeometry

__all__ = [
    "P", "M_MAX", "ProofError", "DecodedProof", "topk_indices", "chunk_bits", "find_modulus", "interpolate",
    "evaluate", "encode_proof", "encode_many", "proofs_to_b64", "proofs_from_b64", "build_proofs", "build_proofs_many",
    "chunk_count", "decode_proof", "proof_to_b64", "proof_from_b64", "proof_len",
]

P = 65497  # the prime field modulus
M_MAX = 65497  # largest index modulus
_BLOCK = 32  # values per group of the top-k prefilter
_BABY = 16  # baby steps of the polynomial evaluation


class ProofError(ValueError):
    """An untrusted proof is malformed; the message is the rejection reason."""


_INV: np.ndarray | None = None


def _inv_table() -> np.ndarray:
    """inv[a] = a^(p-2) mod p for a in [0, p) (inv[0] = 0), vectorised square-and-multiply."""
    global _INV
    if _INV is None:
        a = np.arange(P, dtype=np.int64)
        res = np.ones(P, dtype=np.int64)
        base = a.copy()
        e = P - 2
        while e:
            if e & 1:
                res = res * base % P
            base = base * base % P
            e >>= 1
        res[0] = 0
        _INV = res
    return _INV


_INV2: np.ndarray | None = None


def _inv_table2() -> np.ndarray:
    global _INV2
    if _INV2 is None:
        _INV2 = np.concatenate([_inv_table(), _inv_table()])
    return _INV2


def proof_len(k: int) -> int:
    return 2 + 2 * k


# ----------------------------------------------------------------------------------------------
# chunking and top-k


def chunk_bits(hidden: torch.Tensor, chunk: int) -> list[torch.Tensor]:
    """Split [positions, hidden] into row chunks; each as a flat int16 view of its bf16 bits.

    Returns one or two [n_chunks, flat] int16 tensors: all full chunks batched together, and the
    short last chunk (if any) on its own.
    """
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be [positions, hidden], got shape {tuple(hidden.shape)}")
    if chunk < 1:
        raise ValueError("chunk must be >= 1")
    h = hidden.detach()
    if h.dtype != torch.bfloat16:
        h = h.to(torch.bfloat16)
    h = h.cpu().contiguous()
    n, d = h.shape
    bits = h.view(torch.int16)
    full = n // chunk
    out = []
    if full:
        out.append(bits[: full * chunk].reshape(full, chunk * d))
    if n % chunk:
        out.append(bits[full * chunk:].reshape(1, (n % chunk) * d))
    return out


def _exact_topk(mag: np.ndarray, k: int) -> np.ndarray:
    """Exact top-k with the lower-index tie rule via unique int64 keys. mag: [C, N] int (>= -1)."""
    n = mag.shape[1]
    shift = max(1, int(n).bit_length())
    key = (mag.astype(np.int64) << shift) | (n - 1 - np.arange(n, dtype=np.int64))
    if k == n:
        return np.broadcast_to(np.arange(n, dtype=np.int64), key.shape).copy()
    return np.argpartition(-key, k - 1, axis=1)[:, :k].astype(np.int64)


def topk_indices(bits: torch.Tensor | np.ndarray, k: int) -> np.ndarray:
    """Indices [C, k] (int64, unordered) of the k largest magnitudes per row of bf16 bit patterns [C, N].

    Prefilter: split each row into nb strided groups g_j = {i * nb + j} and take each group's largest
    magnitude. The k-th largest group max B_k is a lower bound of the k-th largest value (k distinct
    elements reach it), so the top-k lies among the elements >= B_k of the groups whose max is >= B_k:
    typically a few hundred per row. Those are ranked exactly (magnitude, then lower index) with one sort
    for all rows. The group maxima need no magnitude array: the largest signed int16 of a group is its
    largest magnitude with the sign bit clear (negative if there is none), the largest uint16 with the top
    bit flipped is its largest magnitude with the sign bit set (negative as int16 if there is none), so two
    read-only reductions replace a masking pass. Single-threaded numpy: memory-bound, immune to thread
    oversubscription.
    """
    b = bits.numpy() if isinstance(bits, torch.Tensor) else np.asarray(bits)
    c, n = b.shape
    if k > n:
        raise ValueError(f"k={k} > {n} values")
    if n <= 8 * _BLOCK * k or c == 0:
        return _exact_topk(np.bitwise_and(b, 0x7FFF), k)
    if b.dtype != np.int16:
        b = b.astype(np.int16)
    nb = -(-n // _BLOCK)
    width = nb * _BLOCK
    if width != n:  # pad with +0.0: magnitude 0 at indices above every real one, so never preferred to one
        b = np.concatenate([b, np.zeros((c, width - n), dtype=np.int16)], axis=1)
    groups = b.reshape(c, _BLOCK, nb)  # groups[:, g, j] is flat index g * nb + j
    pos_max = np.maximum.reduce(groups, axis=1)  # [C, nb]
    neg_max = (np.maximum.reduce(groups.view(np.uint16), axis=1) ^ 0x8000).view(np.int16)
    gmax = np.maximum(pos_max, neg_max)  # largest magnitude of each group (>= 0)
    bk = np.partition(gmax, nb - k, axis=1)[:, nb - k]  # k-th largest group max per row
    sel = np.flatnonzero(gmax >= bk[:, None])  # the groups that can hold top-k elements (~k per row)
    gr, gj = np.divmod(sel, nb)
    vals = groups[gr, :, gj] & 0x7FFF  # [groups, G] magnitudes
    hit = np.flatnonzero(vals >= bk[gr][:, None])
    gi, gg = np.divmod(hit, _BLOCK)
    rr = gr[gi]
    ii = gg * nb + gj[gi]  # flat index within the row
    shift = max(1, int(width).bit_length())
    key = (vals.reshape(-1)[hit].astype(np.int64) << shift) | (width - 1 - ii)  # unique per row, larger = better
    kbits = 15 + shift
    if int(c).bit_length() + kbits < 63:
        order = np.argsort((rr << kbits) | ((1 << kbits) - 1 - key))  # by row, then key descending
    else:
        order = np.lexsort((-key, rr))
    counts = np.bincount(rr, minlength=c)
    starts = np.cumsum(counts) - counts
    return ii[order][starts[:, None] + np.arange(k)].astype(np.int64)


# ----------------------------------------------------------------------------------------------
# modulus, interpolation, evaluation (numpy int64, all chunks at once)


def _has_collision(r: np.ndarray) -> np.ndarray:
    """r: [..., k] residues; True where some row has two equal entries."""
    s = np.sort(r, axis=-1)
    return (s[..., 1:] == s[..., :-1]).any(axis=-1)


def find_modulus(x: np.ndarray) -> np.ndarray:
    """Largest m <= 65497 with x mod m pairwise distinct per row. x: [C, k] int64 -> [C] int64."""
    c, k = x.shape
    m = np.full(c, M_MAX, dtype=np.int64)
    bad = np.nonzero(_has_collision(x % M_MAX))[0]
    start = M_MAX - 1
    step = 64
    while bad.size:
        cands = np.arange(start, max(start - step, 0), -1, dtype=np.int64)  # descending
        if cands.size == 0 or cands[0] < k:
            raise ValueError("no index modulus >= k separates these indices")
        coll = _has_collision(x[bad][:, None, :] % cands[None, :, None])  # [b, step]
        good = ~coll
        found = good.any(axis=1)
        first = good.argmax(axis=1)
        m[bad[found]] = cands[first[found]]
        bad = bad[~found]
        start -= step
    return m


def interpolate(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Coefficients [C, n] (ascending) of the polynomials of degree < n with P(x) = y mod p.

    x: [C, n] pairwise distinct residues in [0, p); y: [C, n] in [0, p). Newton divided differences, then
    expansion to the monomial basis, vectorised across chunks. The arithmetic is in float64 on signed residues in
    [-p/2, p/2] (every product is < 2^33, exact in a double; ``t - rint(t / p) p`` reduces it exactly, since t / p
    is never within 1 / (2p) of a half), laid out [n, C] so each of the n sequential steps works on contiguous
    rows: several times faster than int64 ``%``, the same coefficients.
    """
    inv2 = _inv_table2_f64()  # inv2[d + p] = 1/d for d in (-p, p), as floats
    x = np.asarray(x, dtype=np.int64) % P
    c, n = x.shape
    xt = np.ascontiguousarray(x.T)  # [n, C]
    a = _signed(np.ascontiguousarray((np.asarray(y, dtype=np.int64) % P).T).astype(np.float64))
    for j in range(1, n):
        # (a_i - a_{i-1}) / (x_i - x_{i-j}) for i >= j
        t = a[j:] - a[j - 1: n - 1]
        t *= inv2[xt[j:] - xt[: n - j] + P]
        a[j:] = _signed(t)
    poly = np.zeros((n, c), dtype=np.float64)
    poly[0] = a[n - 1]
    negx = -xt.astype(np.float64)
    for i in range(n - 2, -1, -1):
        # poly <- poly * (X - x_i) + a_i ; only the w = n - i low rows can be non-zero afterwards
        w = n - i
        t = poly[:w] * negx[i]
        t[1:] += poly[: w - 1]
        t[0] += a[i]
        poly[:w] = _signed(t)
    out = poly.T.astype(np.int64)
    out %= P
    return out


_INV_P = 1.0 / P


def _signed(t: np.ndarray) -> np.ndarray:
    """t mod p as a signed residue in [-p/2, p/2], in place (t: float64 integers, |t| < 2^40)."""
    q = t * _INV_P
    np.rint(q, out=q)
    q *= P
    t -= q
    return t


_INV2F: np.ndarray | None = None


def _inv_table2_f64() -> np.ndarray:
    global _INV2F
    if _INV2F is None:
        _INV2F = _inv_table2().astype(np.float64)
    return _INV2F


def evaluate(coeffs: np.ndarray, x: np.ndarray) -> np.ndarray:
    """P(x) mod p for ascending coeffs [C, k] at points x [C, n] -> [C, n] int64 in [0, p).

    Baby-step giant-step instead of k Horner steps: the powers x^0..x^(B-1) mod p (B - 1 modular
    products), then the k / B inner polynomials of B coefficients as one batched float64 matmul (each a
    sum of B products < p^2, so < 2^36: exact in a double), then Horner in y = x^B over the k / B inner
    values. About 2 sqrt(k) modular passes over [C, n] instead of k.
    """
    coeffs = np.asarray(coeffs, dtype=np.int64)
    x = np.asarray(x, dtype=np.int64) % P
    c, k = coeffs.shape
    n = x.shape[1]
    if k == 0:
        return np.zeros((c, n), dtype=np.int64)
    bs = max(1, min(_BABY, k))
    nblk = -(-k // bs)
    if nblk * bs != k:
        coeffs = np.concatenate([coeffs, np.zeros((c, nblk * bs - k), dtype=np.int64)], axis=1)
    pw = np.empty((bs, c, n), dtype=np.int64)  # pw[i] = x^i mod p
    pw[0] = 1
    if bs > 1:
        pw[1] = x
    for i in range(2, bs):
        np.multiply(pw[i - 1], x, out=pw[i])
        np.remainder(pw[i], P, out=pw[i])
    inner = np.matmul(pw.astype(np.float64).transpose(1, 2, 0),  # [C, n, B]
                      coeffs.reshape(c, nblk, bs).astype(np.float64).transpose(0, 2, 1))  # [C, B, nblk]
    inner = inner.astype(np.int64) % P  # [C, n, nblk]: inner[..., j] = sum_i c[j*B + i] x^i
    if nblk == 1:
        return np.ascontiguousarray(inner[..., 0])
    y = pw[bs - 1] * x % P  # x^B
    acc = inner[..., nblk - 1].copy()
    for j in range(nblk - 2, -1, -1):
        acc *= y
        acc += inner[..., j]
        np.remainder(acc, P, out=acc)
    return acc


# ----------------------------------------------------------------------------------------------
# bytes


def encode_proof(m: int, coeffs: np.ndarray) -> bytes:
    arr = np.empty(1 + len(coeffs), dtype=">u2")
    arr[0] = m
    arr[1:] = coeffs
    return arr.tobytes()


def encode_many(m: np.ndarray, coeffs: np.ndarray) -> list[bytes]:
    arr = np.empty((coeffs.shape[0], 1 + coeffs.shape[1]), dtype=">u2")
    arr[:, 0] = m
    arr[:, 1:] = coeffs
    return [row.tobytes() for row in arr]


@dataclass(frozen=True)
class DecodedProof:
    m: int
    coeffs: np.ndarray  # [k] int64


def decode_proof(data: object, k: int) -> DecodedProof:
    """Parse and validate an untrusted proof; raises ProofError with the reason."""
    if isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    if not isinstance(data, bytes):
        raise ProofError(f"proof is {type(data).__name__}, not bytes")
    want = proof_len(k)
    if len(data) != want:
        raise ProofError(f"proof is {len(data)} bytes, expected exactly {want} for k={k}")
    if not any(data):
        raise ProofError("null proof (all bytes zero)")
    arr = np.frombuffer(data, dtype=">u2").astype(np.int64)
    m = int(arr[0])
    if not (1 <= m <= M_MAX):
        raise ProofError(f"index modulus {m} outside [1, {M_MAX}]")
    if m < k:
        raise ProofError(f"index modulus {m} < k={k}")
    coeffs = arr[1:]
    big = np.nonzero(coeffs >= P)[0]
    if big.size:
        raise ProofError(f"coefficient {int(big[0])} = {int(coeffs[big[0]])} is not < p={P}")
    return DecodedProof(m, coeffs)


def proof_to_b64(proof: bytes) -> str:
    return base64.b64encode(proof).decode("ascii")


def proof_from_b64(text: object, k: int | None = None) -> bytes:
    """Strict base64 (RFC 4648 alphabet, padding required); raises ProofError on bad input."""
    if not isinstance(text, (str, bytes)):
        raise ProofError(f"base64 proof is {type(text).__name__}, not str")
    if k is not None:
        want = 4 * -(-proof_len(k) // 3)
        if len(text) != want:
            raise ProofError(f"base64 proof is {len(text)} chars, expected {want} for k={k}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ProofError(f"invalid base64: {e}") from None


# ----------------------------------------------------------------------------------------------
# building proofs


def chunk_count(positions: int, chunk: int) -> int:
    return -(-positions // chunk)


def build_proofs(hidden: torch.Tensor, geometry: ProofGeometry = PROOF_GEOMETRY) -> list[bytes]:
    """One proof (2 + 2k bytes) per chunk of ``geometry.chunk`` positions of a [positions, hidden] tensor (none for
    no position): for a sampled completion, ``SampleOutput.hidden[i]`` ([len(completion), hidden]) at the run's
    proof geometry (``contract.proof``), what an inference worker stores in the rollouts' ``proofs`` column.

    ``hidden`` is the final-norm hidden state (LM-head input); it is rounded to bf16 if needed.
    """
    chunk, k = geometry.chunk, geometry.k
    if not 1 <= k <= M_MAX:
        raise ValueError(f"k must be in [1, {M_MAX}]")
    proofs: list[bytes] = []
    if hidden.shape[0] == 0:  # a completion without model tokens (also as a 1-d empty tensor)
        return proofs
    for bits in chunk_bits(hidden, chunk):
        c, n = bits.shape
        ke = min(k, n)
        x = topk_indices(bits, ke)
        y = np.take_along_axis(bits.numpy(), x, axis=1).astype(np.int64) & 0xFFFF
        m = find_modulus(x)
        coeffs = interpolate(x % m[:, None], y % P)
        if ke < k:
            coeffs = np.concatenate([coeffs, np.zeros((c, k - ke), dtype=np.int64)], axis=1)
        proofs.extend(encode_many(m, coeffs))
    return proofs


def build_proofs_many(hiddens: list[torch.Tensor], geometry: ProofGeometry = PROOF_GEOMETRY) -> list[list[bytes]]:
    """``build_proofs`` of many [positions, hidden] tensors at once (every completion of a batch,
    ``SampleOutput.hidden``), byte for byte the same: the chunks of every tensor with the same number of values are
    proved together (one top-k, modulus search and interpolation per chunk width instead of per tensor; a batch of
    short completions has one or a few widths), which takes the per-call numpy overhead of the k-step
    interpolation loops out of the per-row cost."""
    chunk, k = geometry.chunk, geometry.k
    if not 1 <= k <= M_MAX:
        raise ValueError(f"k must be in [1, {M_MAX}]")
    by_width: dict[int, list[tuple[int, int, torch.Tensor]]] = {}  # width -> (tensor, its chunk, bits row(s))
    counts = [0] * len(hiddens)
    for t, h in enumerate(hiddens):
        if h.shape[0] == 0:  # no position, no proof (also a 1-d empty tensor)
            continue
        for bits in chunk_bits(h, chunk):
            by_width.setdefault(bits.shape[1], []).append((t, counts[t], bits))
            counts[t] += bits.shape[0]
    out: list[list[bytes]] = [[b""] * c for c in counts]
    # top-k per chunk width; then one modulus search and one interpolation per number of points ke = min(k, width):
    # with hidden >= k every width has ke = k, so a batch of completions of many lengths is interpolated in one call
    by_ke: dict[int, list[tuple[np.ndarray, np.ndarray, list[tuple[int, int, torch.Tensor]]]]] = {}
    for n, parts in by_width.items():
        bits = np.concatenate([b.numpy() for _, _, b in parts], axis=0)
        ke = min(k, n)
        x = topk_indices(bits, ke)
        y = np.take_along_axis(bits, x, axis=1).astype(np.int64) & 0xFFFF
        by_ke.setdefault(ke, []).append((x, y, parts))
    for ke, groups in by_ke.items():
        x = np.concatenate([g[0] for g in groups], axis=0)
        y = np.concatenate([g[1] for g in groups], axis=0)
        m = find_modulus(x)
        coeffs = interpolate(x % m[:, None], y % P)
        if ke < k:
            coeffs = np.concatenate([coeffs, np.zeros((x.shape[0], k - ke), dtype=np.int64)], axis=1)
        enc = encode_many(m, coeffs)
        row = 0
        for _, _, parts in groups:
            for t, first, b in parts:
                for j in range(b.shape[0]):
                    out[t][first + j] = enc[row]
                    row += 1
    return out


def proofs_to_b64(proofs: list[bytes]) -> list[str]:
    return [proof_to_b64(p) for p in proofs]


def proofs_from_b64(texts: object, k: int = PROOF_GEOMETRY.k, max_proofs: int = 1 << 16) -> list[bytes]:
    """Decode a list of base64 proofs (untrusted); raises ProofError naming the bad entry."""
    if not isinstance(texts, (list, tuple)):
        raise ProofError(f"proofs must be a list of base64 strings, got {type(texts).__name__}")
    if len(texts) > max_proofs:
        raise ProofError(f"{len(texts)} proofs is over the {max_proofs} limit")
    out = []
    for i, t in enumerate(texts):
        try:
            out.append(proof_from_b64(t, k))
        except ProofError as e:
            raise ProofError(f"proof {i}: {e}") from None
    return out
