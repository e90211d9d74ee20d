"""Delta versions (issue 40, the format): a weights file as the changed elements since the one before, applied
bit-exact or refused (another base, truncated, reordered, oversized or forged)."""

from __future__ import annotations

import json
import struct
import zlib

import pytest
import torch
from safetensors.torch import save

from swarmrl.shardcast.delta import MAGIC, DeltaError, apply_delta, encode_delta, read_header


def _weights(seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(64, 32, generator=g).to(dtype), "b.bias": torch.randn(32, generator=g).to(dtype)}


def _step(w: dict[str, torch.Tensor], share: float, seed: int) -> dict[str, torch.Tensor]:
    """A few elements moved, as an optimizer step moves a bfloat16 model's."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, t in w.items():
        mask = torch.rand(t.shape, generator=g) < share
        out[k] = torch.where(mask, (t.float() + 0.05).to(t.dtype), t)
    return out


def test_a_chain_of_deltas_gives_the_trainers_files_bit_for_bit():
    w = _weights()
    files = [save(w)]
    for s in range(1, 5):
        w = _step(w, 0.03, s)
        files.append(save(w))
    held = files[0]
    for prev, nxt in zip(files, files[1:]):
        d = encode_delta(prev, nxt)
        assert d is not None and len(d) < len(nxt) / 4
        assert 0.0 < read_header(d).share < 0.1
        held = apply_delta(held, d)
        assert held == nxt
    # float32 elements too
    a, b = save(_weights(dtype=torch.float32)), save(_step(_weights(dtype=torch.float32), 0.01, 9))
    assert apply_delta(a, encode_delta(a, b, elem=4)) == b


def test_nothing_changed_is_a_small_delta_and_a_changed_layout_needs_a_keyframe():
    f = save(_weights())
    d = encode_delta(f, f)
    assert d is not None and read_header(d).changed == 0 and apply_delta(f, d) == f
    other = save({**_weights(), "c.new": torch.zeros(3, dtype=torch.bfloat16)})
    assert encode_delta(f, other) is None


def test_a_delta_against_another_base_is_refused_with_the_reason():
    a, b = save(_weights(0)), save(_step(_weights(0), 0.02, 1))
    d = encode_delta(a, b)
    with pytest.raises(DeltaError, match="against base"):
        apply_delta(save(_weights(5)), d)


def _parts(d: bytes) -> tuple[dict, bytes, bytes]:
    n = struct.unpack("<I", d[8:12])[0]
    h = json.loads(d[12:12 + n])
    body = d[12 + n:]
    return h, body[:h["gaps_len"]], body[h["gaps_len"]:]


def _pack(h: dict, gz: bytes, vz: bytes) -> bytes:
    hb = json.dumps(h, sort_keys=True, separators=(",", ":")).encode()
    return MAGIC + struct.pack("<I", len(hb)) + hb + gz + vz


@pytest.mark.parametrize("forge,why", [
    (lambda d: d[:-5], "do not add up"),  # truncated
    (lambda d: d + b"\0", "do not add up"),  # padded
    (lambda d: b"XXXXXXXX" + d[8:], "not a delta"),
    (lambda d: d[:8] + struct.pack("<I", 1 << 20) + d[12:], "out of bounds"),
])
def test_broken_deltas_are_refused_before_they_touch_the_weights(forge, why):
    a, b = save(_weights()), save(_step(_weights(), 0.02, 1))
    with pytest.raises(DeltaError, match=why):
        apply_delta(a, forge(encode_delta(a, b)))


def test_reordered_forged_and_oversized_parts_are_refused():
    a, b = save(_weights()), save(_step(_weights(), 0.02, 1))
    h, gz, vz = _parts(encode_delta(a, b))
    # the parts swapped (lengths swapped to match): not what the header says once decompressed
    with pytest.raises(DeltaError):
        apply_delta(a, _pack({**h, "gaps_len": len(vz), "values_len": len(gz)}, vz, gz))
    # values forged (another value at a changed place): the result is not the signed target
    vals = bytearray(zlib.decompress(vz))
    vals[0] ^= 0x40
    forged = zlib.compress(bytes(vals))
    with pytest.raises(DeltaError, match="hash mismatch"):
        apply_delta(a, _pack({**h, "values_len": len(forged)}, gz, forged))
    # a bomb: values that decompress far past what the header counts stop at the bound
    bomb = zlib.compress(b"\0" * (64 << 20))
    with pytest.raises(DeltaError, match="not .* bytes once decompressed"):
        apply_delta(a, _pack({**h, "values_len": len(bomb)}, gz, bomb))
    # more changed elements than the data region holds
    with pytest.raises(DeltaError, match="do not fit"):
        apply_delta(a, _pack({**h, "changed": 10**9}, gz, vz))
    # positions past the end of the data region
    far = zlib.compress(struct.pack("<I", 10**7) * h["changed"])
    with pytest.raises(DeltaError, match="past the data region"):
        apply_delta(a, _pack({**h, "gaps_len": len(far)}, far, vz))
