"""TOPLOC build/verify speed: 2048 positions x 4096 hidden, k = 128, chunk = 32 (64 proofs).

Baselines measured in the same run: a straightforward per-chunk reference (one chunk at a time, Python-int
Newton interpolation and Horner evaluation, the same top-k rule so bytes must match), plus the
reference figures of a well-built C++ implementation on this machine (270 ms build, 40 ms verify).

    python benchmarks/toploc/bench.py [--threads 2] [--reps 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from swarmrl.toploc.proof import M_MAX, P, build_proofs, chunk_bits, encode_proof
from swarmrl.toploc.verify import verify_proofs

CPP_BUILD_MS, CPP_VERIFY_MS = 270.0, 40.0


def _ref_topk(row: torch.Tensor, k: int) -> list[int]:
    mag = torch.bitwise_and(row, 0x7FFF).to(torch.int64)
    n = row.numel()
    key = (mag << 18) | (n - 1 - torch.arange(n))
    return key.topk(k).indices.tolist()


def ref_build(hidden: torch.Tensor, chunk: int = 32, k: int = 128) -> list[bytes]:
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


def ref_verify(hidden: torch.Tensor, proofs: list[bytes], chunk: int = 32, k: int = 128) -> list[tuple]:
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


def _time(fn, reps: int) -> tuple[float, float, object]:
    res = fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        res = fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3, min(ts) * 1e3, res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--positions", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--skip-reference", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(a.positions, a.hidden, generator=g).to(torch.bfloat16)
    build_ms, build_min, proofs = _time(lambda: build_proofs(h), a.reps)
    # an honest verifier's states differ slightly from the prover's
    noisy = (h.float() * (1 + 1e-3 * torch.randn(h.shape, generator=g))).to(torch.bfloat16)
    verify_ms, verify_min, checks = _time(lambda: verify_proofs(noisy, proofs), a.reps)
    assert all(c.passed for c in checks)
    states = h.numel() * 2
    size = sum(len(p) for p in proofs)
    print(f"TOPLOC bench: {a.positions} positions x {a.hidden} hidden bf16, k=128, chunk=32, "
          f"{len(proofs)} proofs, torch threads={a.threads} (the proof code itself is single-threaded numpy), "
          f"median of {a.reps}")
    print(f"proof size: {size} bytes for {states} bytes of states = {size / states:.5f} "
          f"(1/{states / size:.0f})")
    print(f"ours      : build {build_ms:8.1f} ms   verify {verify_ms:8.1f} ms  (min {build_min:.1f} / {verify_min:.1f} ms)")
    print(f"C++ ref   : build {CPP_BUILD_MS:8.1f} ms   verify {CPP_VERIFY_MS:8.1f} ms  (reference figures)"
          f"  -> ours is {CPP_BUILD_MS / build_ms:.1f}x / {CPP_VERIFY_MS / verify_ms:.1f}x faster")
    if not a.skip_reference:
        t = time.perf_counter()
        rp = ref_build(h)
        rb = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        rc = ref_verify(noisy, rp)
        rv = (time.perf_counter() - t) * 1e3
        same = rp == proofs
        same_v = all((c.exp_mismatches, c.mant_err_mean, c.mant_err_median) == r for c, r in zip(checks, rc))
        print(f"per-chunk : build {rb:8.1f} ms   verify {rv:8.1f} ms  (straightforward reference, this run)"
              f"  -> ours is {rb / build_ms:.0f}x / {rv / verify_ms:.0f}x faster; identical bytes: {same}, "
              f"identical metrics: {same_v}")


if __name__ == "__main__":
    main()
