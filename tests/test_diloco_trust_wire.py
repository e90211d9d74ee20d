"""The aggregator's wire (swarmrl.diloco.trust.wire): uploads, results and states round-trip; every malformed
upload, however mangled, is refused with a WireError carrying its status (never another exception)."""

from __future__ import annotations

import json
import random
import struct

import pytest
import torch

from swarmrl.diloco.trust import wire

NUMEL, CHUNK = 5000, 1024


def _good(x: torch.Tensor | None = None, round_no: int = 3) -> bytes:
    x = torch.randn(NUMEL, generator=torch.Generator().manual_seed(0)) if x is None else x
    return wire.encode_upload(*wire.quantize(x, CHUNK), "run", round_no, "ab" * 8)


def _check(body: bytes, round_no: int = 3) -> wire.Upload:
    return wire.check_upload(body, NUMEL, CHUNK, run_id="run", round_no=round_no, digest="ab" * 8)


def test_an_upload_round_trips_within_half_an_int8_step():
    x = torch.randn(NUMEL, generator=torch.Generator().manual_seed(1))
    up = _check(_good(x))
    assert up.round == 3 and up.meta.run_id == "run"
    step = wire.quantize(x, CHUNK)[1]
    err = (up.vector - x).abs()
    assert all(float(err[i * CHUNK:(i + 1) * CHUNK].max()) <= float(step[i]) / 2 * 1.0001 for i in range(len(step)))
    assert len(_good(x)) <= wire.max_upload_bytes(NUMEL, CHUNK)


def test_results_and_states_round_trip():
    codes, scales = wire.quantize(torch.randn(NUMEL), CHUNK)
    r = wire.Result(7, "ab" * 8, "cd" * 8, ["a" * 32], [{"node_id": "b" * 32, "reason": "opposed"}], 42, codes, scales)
    back = wire.decode_result(wire.encode_result(r), NUMEL, CHUNK)
    assert (back.round, back.accepted, back.rejected, back.score_seed) == (7, r.accepted, r.rejected, 42)
    assert torch.equal(back.vector(CHUNK), wire.dequantize(codes, scales, CHUNK))
    st = wire.State(2, 2, "ab" * 8, torch.randn(NUMEL), None)
    back = wire.decode_state(wire.encode_state(st), NUMEL)
    assert back.momentum is None and torch.equal(back.anchor, st.anchor) and back.round == 2


def _with_header(head: dict, data: bytes) -> bytes:
    h = json.dumps(head).encode()
    return struct.pack("<Q", len(h)) + h + data


@pytest.mark.parametrize("mangle,status", [
    (lambda h: {**h, "codes": {**h["codes"], "data_offsets": []}}, 422),
    (lambda h: {**h, "codes": {**h["codes"], "data_offsets": "x"}}, 422),
    (lambda h: {**h, "codes": {**h["codes"], "data_offsets": [0, 1.5]}}, 422),
    (lambda h: {**h, "codes": {**h["codes"], "shape": [NUMEL, 1]}}, 422),
    (lambda h: {**h, "codes": "I8"}, 422),
    (lambda h: {**h, "scales": {**h["scales"], "data_offsets": h["codes"]["data_offsets"]}}, 422),
    (lambda h: {**h, "__metadata__": {"run_id": "run", "round": 3, "anchor_digest": "ab" * 8}}, 422),
    (lambda h: {**h, "__metadata__": {**h["__metadata__"], "extra": "1"}}, 422),
    (lambda h: {**h, "__metadata__": "x"}, 422),
    (lambda h: {**h, "__metadata__": {**h["__metadata__"], "round": "4"}}, 409),
    (lambda h: {**h, "__metadata__": {**h["__metadata__"], "anchor_digest": "cd" * 8}}, 409),
])
def test_a_mangled_header_is_refused_with_its_status(mangle, status):
    body = _good()
    (n,) = struct.unpack("<Q", body[:8])
    head, data = json.loads(body[8:8 + n]), body[8 + n:]
    with pytest.raises(wire.WireError) as e:
        _check(_with_header(mangle(head), data))
    assert e.value.status == status


def test_random_corruption_only_ever_raises_wire_errors():
    body = bytearray(_good())
    rng = random.Random(0)
    statuses = set()
    for _ in range(300):
        b = bytearray(body)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(0, min(len(b), 400))  # the header and the first bytes of data
            b[i] = rng.randrange(256)
        if rng.random() < 0.2:
            b = b[: rng.randrange(len(b))]
        try:
            _check(bytes(b))
        except wire.WireError as e:
            statuses.add(e.status)
    assert statuses <= {409, 413, 422} and 422 in statuses
    with pytest.raises(wire.WireError) as e:
        _check(bytes(body) + b"\0" * (wire.max_upload_bytes(NUMEL, CHUNK)))
    assert e.value.status == 413
