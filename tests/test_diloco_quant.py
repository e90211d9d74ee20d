"""int8 pseudo-gradients (chunk-scaled, group-shared scales, error feedback) and the overlapped outer step."""

import pytest
import torch

from swarmrl.diloco.outer import (
    Int8Chunked,
    OuterNesterov,
    apply_delayed,
    int8_levels,
    pseudo_gradient,
    wire_bytes,
)

torch.set_num_threads(1)


def _spread(n: int, chunk: int, seed: int = 0) -> torch.Tensor:
    # chunks of very different magnitude: a per-tensor scale would flatten the small ones to zero
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g)
    mags = 10.0 ** torch.arange(-4, 2, dtype=torch.float32)
    for c in range(-(-n // chunk)):
        x[c * chunk:(c + 1) * chunk] *= mags[c % len(mags)]
    return x


@pytest.mark.parametrize("world", [1, 2, 4, 16])
def test_int8_roundtrip_error_is_at_most_half_a_step_per_chunk(world):
    q8 = Int8Chunked(chunk=64)
    x = _spread(1000, 64)  # 1000 is not a multiple of 64: the last chunk is padded
    levels = int8_levels(world)
    amax = q8.absmax(x)
    q = q8.quantize(x, amax, levels)
    assert q.dtype == torch.int8 and q.shape == x.shape
    assert int(q.abs().max()) <= levels
    back = q8.dequantize(q, amax, levels)
    err = (back - x).abs()
    step = (amax / levels).repeat_interleave(64)[: x.numel()]
    assert bool((err <= step / 2 + 1e-7 * step).all())
    # per-chunk: the smallest chunk keeps its own precision (relative error bounded by 1/(2 levels))
    small = slice(0, 64)  # magnitude 1e-4
    assert float(err[small].max()) <= float(x[small].abs().max()) / (2 * levels) * (1 + 1e-6)


def test_int8_sum_of_group_does_not_overflow_and_gives_the_mean():
    world, q8 = 4, Int8Chunked(chunk=32)
    xs = [_spread(200, 32, seed=s) * (s + 1) for s in range(world)]
    shared = torch.stack([q8.absmax(x) for x in xs]).amax(0)  # what the MAX all-reduce yields
    levels = int8_levels(world)
    qs = [q8.quantize(x, shared, levels) for x in xs]
    total8 = qs[0].clone()
    for q in qs[1:]:
        total8 += q  # int8 arithmetic, as gloo's SUM: it would wrap on overflow
    total32 = torch.stack([q.int() for q in qs]).sum(0)
    assert torch.equal(total8.int(), total32)
    mean = q8.dequantize(total8, shared, levels, divisor=world)
    exact = torch.stack(xs).mean(0)
    step = (shared / levels).repeat_interleave(32)[:200]
    assert bool(((mean - exact).abs() <= step / 2 + 1e-6 * step).all())
    assert int8_levels(2) == 63 and int8_levels(127) == 1
    with pytest.raises(ValueError):
        int8_levels(128)


def test_int8_error_feedback_loses_nothing_but_the_last_residual():
    q8 = Int8Chunked(chunk=16)
    g = torch.Generator().manual_seed(1)
    residual = torch.zeros(50)
    sent_total, true_total = torch.zeros(50), torch.zeros(50)
    for _ in range(20):
        x = torch.randn(50, generator=g) * 1e-2
        true_total += x
        y = x + residual
        amax = q8.absmax(y)
        deq = q8.dequantize(q8.quantize(y, amax, 63), amax, 63)
        residual = y - deq
        sent_total += deq
        assert float(residual.abs().max()) <= float(amax.max()) / 126 * (1 + 1e-5)
    assert torch.allclose(sent_total + residual, true_total, atol=1e-6)


def test_int8_zero_and_bad_inputs():
    q8 = Int8Chunked(chunk=8)
    z = torch.zeros(20)
    amax = q8.absmax(z)
    assert torch.equal(q8.dequantize(q8.quantize(z, amax, 63), amax, 63), z)
    with pytest.raises(ValueError):
        q8.quantize(z, torch.zeros(2), 63)  # 20 elements need 3 chunks
    with pytest.raises(ValueError):
        q8.quantize(z, amax, 0)
    with pytest.raises(ValueError):
        Int8Chunked(0)


def test_int8_wire_bytes_count_codes_and_scales():
    assert wire_bytes(148_416, "int8", chunk=4096) == 148_416 + 4 * 37
    assert wire_bytes(4096, "int8", chunk=4096) == 4096 + 4
    assert wire_bytes(10, "fp32") == 40


def test_apply_delayed_by_hand():
    new_anchor = torch.tensor([1.0, 2.0])
    sent = torch.tensor([0.5, 0.5])
    now = torch.tensor([0.25, 1.0])  # progress meanwhile: [-0.25, 0.5]
    assert apply_delayed(new_anchor, sent, now).tolist() == [0.75, 2.5]
    assert torch.equal(apply_delayed(new_anchor, sent, sent), new_anchor)  # tau = 0: just the new anchor
    with pytest.raises(ValueError):
        apply_delayed(new_anchor, sent, torch.zeros(3))


def test_overlapped_rounds_on_a_tiny_case():
    """Two workers whose inner steps add fixed vectors; H = 2, tau = 1, outer lr 1, no momentum.

    Claim: with the all-reduce of round k landing tau steps later, each worker ends at
    new_anchor + (its progress during those tau steps), and the next pseudo-gradient is its total
    progress over the H steps of that round (the tau overlapped steps included).
    """
    d = [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 3.0])]  # worker w's params change by -d[w] per step
    H, tau = 2, 1
    params = [torch.zeros(2), torch.zeros(2)]
    outers = [OuterNesterov(torch.zeros(2), lr=1.0, momentum=0.0) for _ in range(2)]
    pending = None
    for step in range(1, 7):
        for w in range(2):
            params[w] = params[w] - d[w]
        if pending is not None and step >= pending[2]:
            mean, sent, _ = pending
            for w in range(2):
                outers[w].step(mean)
                params[w] = apply_delayed(outers[w].anchor, sent[w], params[w])
            pending = None
        if step % H == 0:
            pgs = [pseudo_gradient(outers[w].anchor, params[w]) for w in range(2)]
            pending = ((pgs[0] + pgs[1]) / 2, [p.clone() for p in params], step + tau)
    # round 1 (steps 1-2): pgs d0*2, d1*2 -> mean [1, 3]; lands at step 3: anchor -[1, 3]
    # after step 3 each worker is at -[1, 3] - d[w]; round 2 ends at step 4: pg = 2 d[w] again
    # (progress over both steps of the round) -> anchor -[2, 6] at step 5; params -[2, 6] - d[w];
    # after step 6 params -[2, 6] - 2 d[w], and round 3 (pg = 2 d[w]) is still in flight
    assert outers[0].anchor.tolist() == [-2.0, -6.0] == outers[1].anchor.tolist()
    assert params[0].tolist() == [-4.0, -6.0] and params[1].tolist() == [-2.0, -12.0]
    assert pending is not None and pending[0].tolist() == [1.0, 3.0]
