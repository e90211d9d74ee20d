"""Fuzzing the verifier with random and mutated proofs: it must never raise, always answer per chunk."""

from __future__ import annotations

import random

import torch

from swarmrl.toploc import ChunkCheck, build_proofs, proof_from_b64, verify_proofs
from swarmrl.toploc.proof import ProofError

torch.set_num_threads(1)

_H = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
_GOOD = build_proofs(_H)


def _mutate(rng: random.Random, p: bytes) -> object:
    b = bytearray(p)
    op = rng.randrange(12)
    if op == 0:  # flip random bits
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    elif op == 1:  # truncate
        b = b[: rng.randrange(len(b))]
    elif op == 2:  # extend
        b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
    elif op == 3:  # random modulus
        m = rng.choice([0, 1, 127, 128, 129, 65496, 65497, 65498, 65535, rng.randrange(65536)])
        b[0:2] = m.to_bytes(2, "big")
    elif op == 4:  # coefficient >= p
        i = rng.randrange(128)
        b[2 + 2 * i: 4 + 2 * i] = rng.randrange(65497, 65536).to_bytes(2, "big")
    elif op == 5:  # fully random bytes of the right length
        b = bytearray(rng.randbytes(len(b)))
    elif op == 6:  # zero everything / everything 0xff
        b = bytearray(len(b)) if rng.random() < 0.5 else bytearray(b"\xff" * len(b))
    elif op == 7:  # wrong type
        return rng.choice([None, 0, 3.5, "x" * 258, [1, 2], {"m": 1}, object(), memoryview(bytes(b)), bytearray(b)])
    elif op == 8:  # swap two coefficients
        i, j = rng.randrange(128), rng.randrange(128)
        ci, cj = b[2 + 2 * i: 4 + 2 * i], b[2 + 2 * j: 4 + 2 * j]
        b[2 + 2 * i: 4 + 2 * i], b[2 + 2 * j: 4 + 2 * j] = cj, ci
    elif op == 9:  # empty
        return b""
    elif op == 10:  # huge
        return bytes(rng.randint(1, 1 << 16))
    else:  # small change in one coefficient
        i = rng.randrange(128)
        v = (int.from_bytes(b[2 + 2 * i: 4 + 2 * i], "big") + rng.randint(1, 5)) % 65497
        b[2 + 2 * i: 4 + 2 * i] = v.to_bytes(2, "big")
    return bytes(b)


def _assert_sane(checks, n=2):
    assert isinstance(checks, list) and len(checks) == n
    for i, c in enumerate(checks):
        assert isinstance(c, ChunkCheck) and c.index == i
        assert c.passed == (c.reason is None)


def test_seeded_mutation_fuzz_never_crashes():
    rng = random.Random(1234)
    failed = 0
    for _ in range(3000):
        proofs: object = [rng.choice(_GOOD) if rng.random() < 0.3 else _mutate(rng, rng.choice(_GOOD))
                          for _ in range(2)]
        r = rng.random()
        if r < 0.05:
            proofs = proofs[: rng.randrange(2)] + [_mutate(rng, _GOOD[0]) for _ in range(rng.randrange(3))]
        elif r < 0.07:
            proofs = rng.choice([None, "abc", b"".join(_GOOD), 7, {0: _GOOD[0]}, tuple(_GOOD)])
        checks = verify_proofs(_H, proofs)
        _assert_sane(checks)
        failed += sum(not c.passed for c in checks)
    assert failed > 2000  # mutations are overwhelmingly rejected


def test_mutated_proof_in_the_right_slot_fails():
    rng = random.Random(99)
    changed = failed = 0
    for _ in range(300):
        bad = _mutate(rng, _GOOD[1])
        if bad == _GOOD[1] or isinstance(bad, (bytearray, memoryview)) and bytes(bad) == _GOOD[1]:
            continue
        checks = verify_proofs(_H, [_GOOD[0], bad])
        _assert_sane(checks)
        assert checks[0].passed
        changed += 1
        failed += not checks[1].passed
    # a changed proof must not pass (a swap of two equal coefficients is the only harmless change)
    assert failed >= changed - 3, (failed, changed)


def _random_item(rng: random.Random) -> object:
    kind = rng.randrange(5)
    if kind == 0:
        return rng.randbytes(rng.randrange(301))
    if kind == 1:
        return rng.randbytes(258)
    if kind == 2:
        return None
    if kind == 3:
        return rng.randint(-(1 << 70), 1 << 70)
    return "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(11)))


def test_random_proof_lists_never_crash():
    rng = random.Random(7)
    for _ in range(1500):
        _assert_sane(verify_proofs(_H, [_random_item(rng) for _ in range(rng.randrange(5))]))


def test_random_base64_never_crashes():
    rng = random.Random(8)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_ \n!"
    for _ in range(2000):
        n = rng.choice([rng.randrange(400), 344])
        text: object = "".join(rng.choice(alphabet) for _ in range(n))
        if rng.random() < 0.2:
            text = rng.randbytes(n)
        try:
            out = proof_from_b64(text, k=128)
            assert isinstance(out, bytes)
        except ProofError:
            pass
