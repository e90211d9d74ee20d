"""TOPLOC build/verify speed against the reference implementation, measured in the same run.

Inputs: [positions, hidden] bf16 states (2048 x 4096 by default, standard normal), k = 128, chunk = 32; the
verifier's states are the prover's with 0.1% multiplicative noise (an honest recomputation that differs slightly).

Columns, all measured in this run (ours and each baseline alternate rep by rep, medians reported):
- ours: ``swarmrl.toploc.build_proofs`` / ``verify_proofs``.
- ref: the reference TOPLOC package ``toploc`` 0.1.x (PrimeIntellect's C++/pybind extension). It is never a
  dependency of swarmrl: point ``--ref-path`` (or ``TOPLOC_REF_PATH``) at a directory holding the ``toploc``
  package (``pip install --no-deps --target DIR toploc==0.1.6``; its wheel must match the installed torch's ABI,
  else build it from its sdist against that torch). Absent or not importable, its columns are null and the JSON
  line says why. What each side does:
    build: ref ``build_proofs_bytes(list(states.split(chunk)), 1, k, skip_prefill=True)`` (per chunk: torch
    ``abs().topk``, the modulus search and Newton interpolation in C++, one Python call per chunk); ours
    ``build_proofs(states, ProofGeometry(chunk=chunk, k=k))``.
    verify: ref ``verify_proofs_bytes(states, proofs, chunk, k, skip_prefill=True)`` (its C++ path, one
    std::thread per core: parse the bytes, torch ``abs().topk`` per chunk, Horner evaluation, exponent /
    mantissa statistics); ours ``verify_proofs(states, proofs, chunk, k)``: the same work plus the hostile-input
    checks of every proof (length, modulus range, coefficients < p, null proofs, count) and the threshold
    verdict per chunk.
- per-chunk: a straightforward Python reference (one chunk at a time, Python-int Newton interpolation and
  Horner, our top-k tie rule): bytes and metrics must equal ours exactly (``--skip-per-chunk`` leaves it out).

Byte identity with the reference: the proof is a function of the chunk's top-k index set, which is unique unless
the k-th largest magnitude is tied (frequent in bf16). Both sides break such ties by their own rule (ours: lower
index; the reference: whatever torch's CPU topk leaves), as the spec allows, so the bench reports identity over
all chunks and over the chunks whose top-k set is unambiguous (those must match), and cross-checks that each
side's proofs pass the other side's verifier under the published thresholds.

    python benchmarks/toploc/bench.py [--ref-path DIR] [--threads 2] [--reps 7]

The last line printed is one JSON object: build_over_ref and verify_over_ref (reference time / our time, > 1 means
ours is faster), our and the reference's milliseconds, and the identity checks.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from types import ModuleType

import numpy as np
import torch

from swarmrl.contract import ProofGeometry
from swarmrl.toploc.proof import M_MAX, P, build_proofs, chunk_bits, encode_proof
from swarmrl.toploc.verify import Thresholds, verify_proofs


def _ref_topk(row: torch.Tensor, k: int) -> list[int]:
    mag = torch.bitwise_and(row, 0x7FFF).to(torch.int64)
    n = row.numel()
    key = (mag << 18) | (n - 1 - torch.arange(n))
    return key.topk(k).indices.tolist()


def per_chunk_build(hidden: torch.Tensor, chunk: int = 32, k: int = 128) -> list[bytes]:
    proofs = []
    for group in chunk_bits(hidden, chunk):
        for row in group:
            idx = _ref_topk(row, k)
            ys = [int(row[i]) & 0xFFFF for i in idx]
            m = M_MAX
            while len({i % m for i in idx}) < k:
                m -= 1
            xs = [i % m for i in idx]
            a = [y % P for y in ys]
            for j in range(1, k):
                for i in range(k - 1, j - 1, -1):
                    a[i] = (a[i] - a[i - 1]) * pow((xs[i] - xs[i - j]) % P, P - 2, P) % P
            poly = [a[k - 1]]
            for i in range(k - 2, -1, -1):
                new = [0] * (len(poly) + 1)
                for d, c in enumerate(poly):
                    new[d + 1] = (new[d + 1] + c) % P
                    new[d] = (new[d] - xs[i] * c) % P
                new[0] = (new[0] + a[i]) % P
                poly = new
            proofs.append(encode_proof(m, poly))
    return proofs


def per_chunk_verify(hidden: torch.Tensor, proofs: list[bytes], chunk: int = 32, k: int = 128) -> list[tuple]:
    out = []
    ci = 0
    for group in chunk_bits(hidden, chunk):
        for row in group:
            pr = proofs[ci]
            ci += 1
            m = int.from_bytes(pr[:2], "big")
            coeffs = [int.from_bytes(pr[2 + 2 * i: 4 + 2 * i], "big") for i in range(k)]
            errs, mism = [], 0
            for j in _ref_topk(row, k):
                x = j % m
                acc = 0
                for c in reversed(coeffs):
                    acc = (acc * x + c) % P
                mine = int(row[j]) & 0xFFFF
                if (acc >> 7) & 0xFF != (mine >> 7) & 0xFF:
                    mism += 1
                else:
                    errs.append(abs((acc & 0x7F) - (mine & 0x7F)))
            errs.sort()
            out.append((mism, sum(errs) / len(errs) if errs else 2.0**64, errs[len(errs) // 2] if errs else 2.0**64))
    return out


def load_reference(path: str | None) -> tuple[ModuleType | None, str | None]:
    """The reference ``toploc`` package from ``path`` (or wherever Python finds one), or (None, why not)."""
    if path:
        if not os.path.isdir(os.path.join(path, "toploc")):
            return None, f"no toploc package under {path}"
        sys.path.insert(0, path)
    try:
        mod = importlib.import_module("toploc")
        for name in ("build_proofs_bytes", "verify_proofs_bytes"):
            getattr(mod, name)
    except Exception as e:  # an ABI mismatch of a wheel surfaces as ImportError / OSError
        first = str(e).splitlines()[0] if str(e) else ""
        return None, f"reference toploc not importable: {type(e).__name__}: {first[:200]}"
    return mod, None


def tied_chunks(hidden: torch.Tensor, chunk: int, k: int) -> list[bool]:
    """Per chunk: is the k-th largest magnitude tied (so the top-k index set is not unique)?"""
    out = []
    for group in chunk_bits(hidden, chunk):
        mag = np.bitwise_and(group.numpy(), 0x7FFF)
        kk = min(k, mag.shape[1])
        kth = -np.partition(-mag, kk - 1, axis=1)[:, kk - 1]
        out.extend(((mag >= kth[:, None]).sum(axis=1) > kk).tolist())
    return out


def _passes(metrics: tuple[int, float, float], th: Thresholds) -> bool:
    e, mu, md = metrics
    return e <= th.max_exp_mismatches and mu <= th.max_mant_err_mean and md <= th.max_mant_err_median


def timed(fns: dict[str, Callable[[], object]], reps: int) -> tuple[dict[str, float], dict[str, object]]:
    """Median milliseconds of each function, run alternately (one warm-up each first) so load drifts hit all."""
    res = {name: fn() for name, fn in fns.items()}
    ts: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t = time.perf_counter()
            res[name] = fn()
            ts[name].append(time.perf_counter() - t)
    return {name: statistics.median(v) * 1e3 for name, v in ts.items()}, res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (both sides)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--positions", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--k", type=int, default=128)
    ap.add_argument("--ref-path", default=os.environ.get("TOPLOC_REF_PATH"),
                    help="directory holding the reference toploc package (default: $TOPLOC_REF_PATH)")
    ap.add_argument("--skip-per-chunk", action="store_true", help="leave out the slow per-chunk Python reference")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    chunk, k = a.chunk, a.k
    g = torch.Generator().manual_seed(0)
    h = torch.randn(a.positions, a.hidden, generator=g).to(torch.bfloat16)
    # an honest verifier's states differ slightly from the prover's
    noisy = (h.float() * (1 + 1e-3 * torch.randn(h.shape, generator=g))).to(torch.bfloat16)
    ref, ref_why = load_reference(a.ref_path)
    th = Thresholds()

    build_fns: dict[str, Callable[[], object]] = {"ours": lambda: build_proofs(h, ProofGeometry(chunk=chunk, k=k))}
    if ref is not None:
        chunks = list(h.split(chunk))
        build_fns["ref"] = lambda: ref.build_proofs_bytes(chunks, 1, k, skip_prefill=True)
    build_ms, built = timed(build_fns, a.reps)
    proofs: list[bytes] = built["ours"]  # type: ignore[assignment]
    verify_fns: dict[str, Callable[[], object]] = {"ours": lambda: verify_proofs(noisy, proofs, chunk, k)}
    if ref is not None:
        verify_fns["ref"] = lambda: ref.verify_proofs_bytes(noisy, proofs, chunk, k, skip_prefill=True)
    verify_ms, verified = timed(verify_fns, a.reps)
    checks = verified["ours"]
    assert all(c.passed for c in checks), "honest states failed our verifier"  # type: ignore[attr-defined]
    ours_metrics = [(c.exp_mismatches, c.mant_err_mean, c.mant_err_median) for c in checks]  # type: ignore[attr-defined]

    states = h.numel() * 2
    size = sum(len(p) for p in proofs)
    print(f"TOPLOC bench: {a.positions} positions x {a.hidden} hidden bf16, k={k}, chunk={chunk}, {len(proofs)} proofs, "
          f"torch threads={a.threads}, median of {a.reps} alternating reps")
    print(f"proof size: {size} bytes for {states} bytes of states (1/{states / size:.0f})")
    print(f"ours      : build {build_ms['ours']:8.1f} ms   verify {verify_ms['ours']:8.1f} ms")

    out: dict[str, object] = {
        "build_over_ref": None, "verify_over_ref": None,
        "ours_build_ms": round(build_ms["ours"], 2), "ours_verify_ms": round(verify_ms["ours"], 2),
        "ref_build_ms": None, "ref_verify_ms": None, "ref_version": None,
        "bytes_identical": None, "bytes_identical_untied": None, "chunks_identical": None, "chunks_tied": None,
        "metrics_identical_untied": None, "cross_verified": None, "ref_skipped": ref_why,
    }
    if ref is not None:
        ref_proofs: list[bytes] = built["ref"]  # type: ignore[assignment]
        ref_checks = verified["ref"]
        ref_metrics = [(r.exp_mismatches, r.mant_err_mean, r.mant_err_median) for r in ref_checks]  # type: ignore[attr-defined]
        tied = tied_chunks(h, chunk, k)
        tied_v = tied_chunks(noisy, chunk, k)
        same = [x == y for x, y in zip(proofs, ref_proofs)]
        untied_same = all(s for s, t in zip(same, tied) if not t)
        metrics_same = all(x == y for x, y, t in zip(ours_metrics, ref_metrics, tied_v) if not t)
        # each side's proofs pass the other side's verifier (published thresholds)
        ours_on_ref = verify_proofs(noisy, ref_proofs, chunk, k)
        ref_on_ours = [(r.exp_mismatches, r.mant_err_mean, r.mant_err_median) for r in ref_checks]  # type: ignore[attr-defined]
        ref_on_refs = ref.verify_proofs_bytes(noisy, ref_proofs, chunk, k, skip_prefill=True)
        cross = (all(c.passed for c in ours_on_ref) and all(_passes(m, th) for m in ref_on_ours)
                 and all(_passes((r.exp_mismatches, r.mant_err_mean, r.mant_err_median), th) for r in ref_on_refs))
        bo, vo = build_ms["ref"] / build_ms["ours"], verify_ms["ref"] / verify_ms["ours"]
        print(f"reference : build {build_ms['ref']:8.1f} ms   verify {verify_ms['ref']:8.1f} ms  "
              f"(toploc {getattr(ref, '__version__', '?')} from {os.path.dirname(os.path.dirname(ref.__file__ or ''))})"
              f"  -> ours is {bo:.2f}x / {vo:.2f}x as fast")
        print(f"identity  : {sum(same)}/{len(same)} proofs byte-identical; {sum(tied)} chunks have a tie at the k-th "
              f"magnitude (index set not unique), the other {len(tied) - sum(tied)} all identical: {untied_same}; "
              f"verify metrics identical on the {len(tied_v) - sum(tied_v)} untied verifier chunks: {metrics_same}; "
              f"each side's proofs pass the other's verifier: {cross}")
        out.update({
            "build_over_ref": round(bo, 3), "verify_over_ref": round(vo, 3),
            "ref_build_ms": round(build_ms["ref"], 2), "ref_verify_ms": round(verify_ms["ref"], 2),
            "ref_version": getattr(ref, "__version__", None),
            "bytes_identical": all(same), "bytes_identical_untied": untied_same,
            "chunks_identical": f"{sum(same)}/{len(same)}", "chunks_tied": sum(tied),
            "metrics_identical_untied": metrics_same, "cross_verified": cross,
        })
    else:
        print(f"reference : skipped ({ref_why})")
    if not a.skip_per_chunk:
        t = time.perf_counter()
        rp = per_chunk_build(h, chunk, k)
        rb = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        rc = per_chunk_verify(noisy, rp, chunk, k)
        rv = (time.perf_counter() - t) * 1e3
        same_b = rp == proofs
        same_v = ours_metrics == rc
        print(f"per-chunk : build {rb:8.1f} ms   verify {rv:8.1f} ms  (Python, once)  identical bytes: {same_b}, "
              f"identical metrics: {same_v}")
        out.update({"per_chunk_bytes_identical": same_b, "per_chunk_metrics_identical": same_v})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
