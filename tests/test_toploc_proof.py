"""TOPLOC proof format: spec test vectors byte for byte, interpolation, modulus collisions, verify metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from swarmrl.contract import ProofGeometry
from swarmrl.toploc import (
    ProofError,
    Thresholds,
    build_proofs,
    decode_proof,
    proof_from_b64,
    proof_to_b64,
    verify_proofs,
)
from swarmrl.toploc.proof import P, build_proofs_many, evaluate, find_modulus, interpolate, topk_indices

torch.set_num_threads(1)


def test_spec_vector_1_bytes_and_base64():
    h = torch.tensor([[0.5, -3.0, 1.0, 2.0, -0.25, 8.0]], dtype=torch.bfloat16)
    (proof,) = build_proofs(h, ProofGeometry(chunk=1, k=3))
    assert proof.hex() == "ffd930ff7f191028"
    assert proof_to_b64(proof) == "/9kw/38ZECg="
    assert proof_from_b64("/9kw/38ZECg=", k=3) == proof
    d = decode_proof(proof, 3)
    assert d.m == 65497 and d.coeffs.tolist() == [12543, 32537, 4136]


def test_spec_vector_2_modulus_collision():
    z = torch.zeros(65500, dtype=torch.bfloat16)
    z[0], z[3], z[65497] = 4.0, 1.0, 8.0
    (proof,) = build_proofs(z[None], ProofGeometry(chunk=1, k=3))
    assert proof.hex() == "ffd840805633aa26"
    assert proof_to_b64(proof) == "/9hAgFYzqiY="
    # honest verification must reduce indices mod m (here m = 65496 < 65497)
    (check,) = verify_proofs(z[None], [proof], ProofGeometry(chunk=1, k=3))
    assert check.passed and check.exp_mismatches == 0 and check.mant_err_mean == 0


def test_spec_verification_example():
    h = torch.tensor([[0.5, -3.0, 1.0, 2.0, -0.25, 8.0]], dtype=torch.bfloat16)
    proofs = build_proofs(h, ProofGeometry(chunk=1, k=3))
    h2 = torch.tensor([[0.5, -3.015625, 1.0, 2.0, -0.25, 8.0625]], dtype=torch.bfloat16)
    (c,) = verify_proofs(h2, proofs, ProofGeometry(chunk=1, k=3))
    assert c.exp_mismatches == 0
    assert c.mant_err_mean == pytest.approx(2 / 3)
    assert c.mant_err_median == 1  # upper median of [0, 1, 1]
    assert c.passed


def test_interpolation_matches_points_for_random_chunks():
    rng = np.random.default_rng(0)
    x = np.stack([rng.choice(P, size=128, replace=False) for _ in range(5)])
    y = rng.integers(0, P, size=(5, 128))
    co = interpolate(x, y)
    assert co.shape == (5, 128) and co.min() >= 0 and co.max() < P
    assert (evaluate(co, x) == y).all()


def _lagrange_reference(xs: list[int], ys: list[int]) -> list[int]:
    """Ascending coefficients of the interpolating polynomial mod P, with Python integers."""
    n = len(xs)
    out = [0] * n
    for i in range(n):
        basis, denom = [1], 1  # prod_{j != i} (X - x_j) / (x_i - x_j)
        for j in range(n):
            if j != i:
                basis = [((basis[k - 1] if k else 0) - xs[j] * (basis[k] if k < len(basis) else 0)) % P
                         for k in range(len(basis) + 1)]
                denom = denom * (xs[i] - xs[j]) % P
        scale = ys[i] * pow(denom, P - 2, P) % P
        out = [(o + scale * b) % P for o, b in zip(out, basis)]
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 17, 64])
def test_interpolation_equals_exact_integer_lagrange(n):
    """The float64 arithmetic gives the exact coefficients, edge values included (x = 0, y = P - 1)."""
    rng = np.random.default_rng(n)
    x = np.stack([rng.choice(P, size=n, replace=False) for _ in range(4)])
    x[1, 0] = 0 if 0 not in x[1, 1:] else x[1, 0]
    y = rng.integers(0, P, size=(4, n))
    y[2] = P - 1
    y[3, : n // 2 + 1] = 0
    co = interpolate(x, y)
    for row in range(4):
        assert co[row].tolist() == _lagrange_reference(x[row].tolist(), y[row].tolist())


def test_find_modulus_is_largest_collision_free():
    x = np.array([[0, 65497, 5], [1, 2, 3], [10, 10 + 65496, 10 + 2 * 65495]], dtype=np.int64)
    m = find_modulus(x)
    assert m[0] == 65496 and m[1] == 65497
    for row, mm in zip(x, m):
        assert len(set((row % mm).tolist())) == 3
        for bigger in range(int(mm) + 1, 65498):
            assert len(set((row % bigger).tolist())) < 3


@pytest.mark.parametrize("n,spread", [(40000, 4), (70001, 4), (131072, 1000), (131072, 1)])
def test_topk_tie_rule_is_lower_index_and_matches_exact(n, spread):
    g = torch.Generator().manual_seed(n + spread)
    # heavy ties (few distinct magnitudes), odd sizes (padding) and the block-prefilter path
    vals = torch.randint(-spread, spread + 1, (3, n), generator=g).to(torch.bfloat16)
    bits = vals.view(torch.int16)
    idx = topk_indices(bits, 128)
    mag = (bits.to(torch.int32) & 0x7FFF).numpy()
    for r in range(3):
        want = np.lexsort((np.arange(n), -mag[r]))[:128]  # magnitude desc, then lower index
        assert sorted(idx[r].tolist()) == sorted(want.tolist())


def _rand_hidden(n, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g).to(torch.bfloat16)


def test_honest_roundtrip_with_collisions_and_short_last_chunk():
    # 32 x 4096 chunks have indices up to 131071 > 65497: several percent need m < 65497
    h = _rand_hidden(32 * 24 + 5, 4096, seed=1)
    h[0, 0], h[65497 // 4096, 65497 % 4096] = 40.0, -50.0  # flat indices 0 and 65497 collide in chunk 0
    proofs = build_proofs(h)
    assert len(proofs) == 25 and all(len(p) == 258 for p in proofs)
    ms = [decode_proof(p, 128).m for p in proofs]
    assert ms[0] < 65497
    checks = verify_proofs(h, proofs)
    assert all(c.passed and c.exp_mismatches == 0 and c.mant_err_mean == 0 for c in checks)
    noisy = (h.float() * (1 + 2e-3 * torch.randn(h.shape, generator=torch.Generator().manual_seed(9))))
    assert all(c.passed for c in verify_proofs(noisy.to(torch.bfloat16), proofs))


def test_fewer_values_than_k_commits_to_all():
    h = _rand_hidden(33, 64, seed=2)  # last chunk: 1 row x 64 values < k
    proofs = build_proofs(h)
    assert len(proofs) == 2 and len(proofs[1]) == 258
    assert all(c.passed for c in verify_proofs(h, proofs))


def test_small_noise_passes_other_states_fail():
    h = _rand_hidden(64, 512, seed=3)
    proofs = build_proofs(h)
    noisy = (h.float() * (1 + 1e-3 * torch.randn(h.shape, generator=torch.Generator().manual_seed(4)))).to(torch.bfloat16)
    assert all(c.passed for c in verify_proofs(noisy, proofs))
    other = _rand_hidden(64, 512, seed=5)
    assert not any(c.passed for c in verify_proofs(other, proofs))


def test_thresholds_are_configurable():
    h = torch.tensor([[0.5, -3.0, 1.0, 2.0, -0.25, 8.0]], dtype=torch.bfloat16)
    proofs = build_proofs(h, ProofGeometry(chunk=1, k=3))
    h2 = torch.tensor([[0.5, -3.015625, 1.0, 2.0, -0.25, 8.0625]], dtype=torch.bfloat16)
    (c,) = verify_proofs(h2, proofs, ProofGeometry(chunk=1, k=3), thresholds=Thresholds(max_mant_err_median=0))
    assert not c.passed and "median" in c.reason


@pytest.mark.parametrize("bad,why", [
    (b"\x00" * 258, "null"),
    (b"\x00\x01" + b"\x00\x05" * 128, "< k"),
    (b"\xff\xff" + b"\x00\x05" * 128, "outside"),
    (b"\xff\xd9" + b"\xff\xda" + b"\x00\x05" * 127, "not < p"),
    (b"\xff\xd9" + b"\x00\x05" * 127, "bytes"),
    ("not bytes", "str"),
    (None, "NoneType"),
])
def test_malformed_proofs_are_rejected_with_reasons(bad, why):
    h = _rand_hidden(64, 256, seed=6)
    good = build_proofs(h)
    checks = verify_proofs(h, [good[0], bad])
    assert checks[0].passed
    assert not checks[1].passed and why in checks[1].reason
    with pytest.raises(ProofError):
        decode_proof(bad, 128)


def test_proof_count_and_container_are_checked():
    h = _rand_hidden(64, 256, seed=7)
    good = build_proofs(h)
    for proofs, why in [(good[:1], "1 proofs for 2 chunks"), (good * 2, "4 proofs"), ([], "0 proofs"),
                        ("abc", "must be a list"), (None, "must be a list")]:
        checks = verify_proofs(h, proofs)
        assert len(checks) == 2 and not any(c.passed for c in checks)
        assert why in checks[0].reason


def test_bad_base64_is_a_proof_error():
    for text in ["!!!!", "/9kw/38ZECg", 12, "/9kw/38ZECg=="]:
        with pytest.raises(ProofError):
            proof_from_b64(text, k=3)


def test_b64_list_roundtrip_and_errors():
    from swarmrl.toploc import proofs_from_b64, proofs_to_b64

    proofs = build_proofs(_rand_hidden(64, 256, seed=10))
    texts = proofs_to_b64(proofs)
    assert all(len(t) == 344 for t in texts)
    assert proofs_from_b64(texts) == proofs
    with pytest.raises(ProofError, match="proof 1"):
        proofs_from_b64([texts[0], texts[1][:-4]])
    with pytest.raises(ProofError):
        proofs_from_b64("abc")


def test_bits_are_deterministic_for_same_input():
    h = _rand_hidden(96, 1024, seed=8)
    assert build_proofs(h) == build_proofs(h.clone())


def test_batch_verification_equals_one_at_a_time():
    """verify_proofs_batch compares equal-width chunks of many sequences in one pass; each sequence's result must
    be exactly what verify_proofs gives it alone (honest, tampered, short, malformed, wrong count)."""
    from swarmrl.toploc.verify import verify_proofs_batch

    items = []
    for i, n in enumerate([5, 5, 33, 64, 7, 5, 1]):
        h = _rand_hidden(n, 96, seed=10 + i)
        items.append((h, build_proofs(h)))
    items[1] = (_rand_hidden(5, 96, seed=99), items[1][1])  # other states, same width as item 0
    items[4] = (items[4][0], items[4][1] + items[4][1])  # proof count wrong
    bad = bytearray(items[5][1][0])
    bad[0:2] = b"\xff\xff"  # modulus out of range
    items[5] = (items[5][0], [bytes(bad)])
    items[6] = (items[6][0], "not a list")
    batched = verify_proofs_batch(items)
    alone = [verify_proofs(h, p) for h, p in items]
    assert batched == alone
    assert [all(c.passed for c in r) for r in batched] == [True, False, True, True, False, False, False]


def test_batched_proofs_are_byte_identical_to_per_tensor():
    # what nodes attach (one call per rollout batch) must be exactly the per-completion proofs: mixed lengths
    # (empty, short chunk only, full chunks plus a short one, full chunks only), mixed widths, k > short chunk
    hs = [_rand_hidden(n, d, seed=20 + i) for i, (n, d) in
          enumerate([(6, 128), (0, 128), (6, 128), (1, 64), (70, 128), (64, 128), (5, 128), (3, 16)])]
    hs.append(hs[0].clone())  # duplicates are proved independently
    want = [build_proofs(h) if h.shape[0] else [] for h in hs]
    got = build_proofs_many(hs)
    assert got == want
    assert [len(p) for p in got] == [1, 0, 1, 1, 3, 2, 1, 1, 1]
    assert build_proofs_many(hs, ProofGeometry(chunk=4, k=3)) == [build_proofs(h, ProofGeometry(chunk=4, k=3)) if h.shape[0] else [] for h in hs]


@pytest.mark.parametrize("k", [1, 2, 15, 16, 17, 100, 128, 130])
def test_evaluate_equals_horner_for_any_degree(k):
    """The baby-step giant-step evaluation must give exactly Horner's P(x) mod p, blocks of any fill."""
    rng = np.random.default_rng(k)
    co = rng.integers(0, P, size=(3, k))
    co[0] = P - 1  # largest coefficients: the float64 inner sums are at their maximum
    x = rng.integers(0, 1 << 17, size=(3, 9))  # points above p are reduced first
    x[0, :2] = [P - 1, 0]
    want = np.zeros_like(x)
    for r in range(3):
        for j in range(x.shape[1]):
            acc = 0
            for c in reversed(co[r].tolist()):
                acc = (acc * (int(x[r, j]) % P) + c) % P
            want[r, j] = acc
    assert (evaluate(co, x) == want).all()


@pytest.mark.parametrize("n", [131072, 100003])
def test_topk_prefilter_matches_exact_on_any_bit_pattern(n):
    """Rows of arbitrary int16 patterns (NaN / inf / -0.0 / all one sign) through the prefilter path."""
    rng = np.random.default_rng(n)
    rows = [
        rng.integers(-(1 << 15), 1 << 15, size=n),  # any pattern, both signs
        rng.integers(-(1 << 15), 0, size=n),  # sign bit set everywhere: no group has a positive
        rng.integers(0, 1 << 15, size=n),  # sign bit clear everywhere
        np.where(rng.random(n) < 0.5, 0, -(1 << 15)),  # only +0.0 / -0.0: every magnitude ties
        np.where(rng.random(n) < 0.001, rng.integers(-(1 << 15), 1 << 15, size=n), 0),  # mostly zeros
    ]
    bits = np.stack(rows).astype(np.int16)
    idx = topk_indices(bits, 128)
    mag = bits.astype(np.int32) & 0x7FFF
    for r in range(bits.shape[0]):
        want = np.lexsort((np.arange(n), -mag[r]))[:128]
        assert sorted(idx[r].tolist()) == sorted(want.tolist())


def test_batch_verification_on_wide_chunks_equals_one_at_a_time():
    """Full 32 x 4096 chunks (the prefilter path): a sequence compared in place, two sharing a width, and one
    with a rejected proof in the middle give what each gets alone."""
    from swarmrl.toploc.verify import verify_proofs_batch

    hs = [_rand_hidden(96, 4096, seed=40 + i) for i in range(3)]
    items = [(h, build_proofs(h)) for h in hs]
    tampered = list(items[2][1])
    tampered[1] = b"\x00" * len(tampered[1])  # null proof in the middle
    items[2] = (hs[2], tampered)
    alone = [verify_proofs(h, p) for h, p in items]
    assert [[c.passed for c in r] for r in alone] == [[True] * 3, [True] * 3, [True, False, True]]
    assert verify_proofs_batch(items) == alone
    assert verify_proofs_batch(items[2:]) == alone[2:]
    assert verify_proofs_batch([(hs[0], items[1][1])])[0] == verify_proofs(hs[0], items[1][1])
    assert not any(c.passed for c in verify_proofs(hs[0], items[1][1]))
