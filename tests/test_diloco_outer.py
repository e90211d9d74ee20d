"""DiLoCo core math against hand-computed values (no processes, no network)."""


import pytest
import torch

from swarmrl.diloco.outer import (
    OuterNesterov,
    compress,
    decompress,
    flatten,
    params_digest,
    pseudo_gradient,
    unflatten_into,
    wire_bytes,
)

torch.set_num_threads(1)


def test_pseudo_gradient_is_anchor_minus_current():
    anchor = torch.tensor([1.0, 2.0, -3.0])
    current = torch.tensor([0.5, 2.5, -3.0])
    assert pseudo_gradient(anchor, current).tolist() == [0.5, -0.5, 0.0]
    with pytest.raises(ValueError):
        pseudo_gradient(anchor, torch.zeros(2))


def test_outer_nesterov_two_steps_by_hand():
    # lr 0.7, momentum 0.9. step 1: buf = g = [0.5, -0.5]; update = g + 0.9 buf = [0.95, -0.95]
    # anchor = [1, 2] - 0.7 * update = [0.335, 2.665]
    opt = OuterNesterov(torch.tensor([1.0, 2.0]), lr=0.7, momentum=0.9)
    g1 = pseudo_gradient(torch.tensor([1.0, 2.0]), torch.tensor([0.5, 2.5]))
    a1 = opt.step(g1)
    assert torch.allclose(a1, torch.tensor([0.335, 2.665]), atol=1e-6)
    # step 2: g = [0.1, 0.2]; buf = 0.9 [0.5, -0.5] + g = [0.55, -0.25]
    # update = g + 0.9 buf = [0.595, -0.025]; anchor = [0.335 - 0.4165, 2.665 + 0.0175]
    a2 = opt.step(torch.tensor([0.1, 0.2]))
    assert torch.allclose(a2, torch.tensor([-0.0815, 2.6825]), atol=1e-6)
    assert torch.allclose(opt.buf, torch.tensor([0.55, -0.25]), atol=1e-6)
    assert opt.steps == 2


def test_outer_matches_torch_sgd_nesterov():
    torch.manual_seed(0)
    p0 = torch.randn(50)
    ours = OuterNesterov(p0, lr=0.7, momentum=0.9)
    ref = torch.nn.Parameter(p0.clone())
    sgd = torch.optim.SGD([ref], lr=0.7, momentum=0.9, nesterov=True)
    for _ in range(5):
        g = torch.randn(50) * 0.01
        ours.step(g)
        ref.grad = g.clone()
        sgd.step()
    assert torch.allclose(ours.anchor, ref.detach(), atol=1e-6)


def test_outer_lr1_no_momentum_recovers_averaged_params():
    # with lr 1 and no momentum, the outer step lands on the mean of the workers' parameters
    anchor = torch.tensor([1.0, 1.0])
    workers = [torch.tensor([0.0, 2.0]), torch.tensor([1.0, 0.0])]
    mean_pg = sum(pseudo_gradient(anchor, w) for w in workers) / 2
    out = OuterNesterov(anchor, lr=1.0, momentum=0.0).step(mean_pg)
    assert torch.allclose(out, torch.tensor([0.5, 1.0]))


def test_outer_state_is_cpu_fp32_copy_and_rejects_bad_input():
    src = torch.ones(3, dtype=torch.float64)
    opt = OuterNesterov(src)
    src.add_(1)  # the outer state is a copy
    assert opt.anchor.dtype == torch.float32 and opt.anchor.device.type == "cpu"
    assert opt.anchor.tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError):
        opt.step(torch.zeros(4))
    with pytest.raises(FloatingPointError):
        opt.step(torch.tensor([1.0, float("inf"), 0.0]))
    st = opt.state()
    other = OuterNesterov(torch.zeros(3))
    other.load_state(st["anchor"], st["buf"], st["steps"])
    assert torch.equal(other.anchor, opt.anchor)


def test_compression_roundtrip_and_bytes():
    x = torch.tensor([1 / 3, -2.5, 1e-3])
    for wire, tol in (("fp32", 0.0), ("fp16", 1e-3), ("bf16", 1e-2)):
        c = compress(x, wire)
        assert c.dtype == {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[wire]
        back = decompress(c)
        assert back.dtype == torch.float32
        assert torch.allclose(back, x, rtol=tol, atol=0)
    assert wire_bytes(10, "fp32") == 40 and wire_bytes(10, "fp16") == 20 and wire_bytes(10, "bf16") == 20
    with pytest.raises(ValueError):
        compress(x, "int8")  # type: ignore[arg-type]


def test_flatten_unflatten_roundtrip():
    ts = [torch.arange(6.0).view(2, 3), torch.tensor([7.0])]
    flat = flatten(ts)
    assert flat.tolist() == [0, 1, 2, 3, 4, 5, 7]
    dst = [torch.zeros(2, 3), torch.zeros(1)]
    unflatten_into(flat * 2, dst)
    assert dst[0][1, 2] == 10 and dst[1][0] == 14
    with pytest.raises(ValueError):
        unflatten_into(torch.zeros(3), dst)
    assert params_digest(flat) == params_digest(flat.clone()) != params_digest(flat + 1)


def test_peer_state_is_validated_before_use():
    from swarmrl.diloco.peers import validated_state

    good = ({"round": 3, "outer_steps": 3}, [torch.zeros(4), torch.zeros(4)])
    assert validated_state(good, 4)[0] == 3
    assert validated_state(({"round": 0, "outer_steps": 0}, [torch.zeros(4), torch.zeros(0)]), 4)[3] is None
    bad = [
        ("not a dict", [torch.zeros(4), torch.zeros(4)]),
        ({"round": "3", "outer_steps": 3}, [torch.zeros(4), torch.zeros(4)]),
        ({"round": -1, "outer_steps": 3}, [torch.zeros(4), torch.zeros(4)]),
        ({"round": 3, "outer_steps": 3}, [torch.zeros(4)]),
        ({"round": 3, "outer_steps": 3}, [torch.zeros(5), torch.zeros(4)]),
        ({"round": 3, "outer_steps": 3}, [torch.tensor([0.0, float("nan"), 0.0, 0.0]), torch.zeros(4)]),
    ]
    for item in bad:
        with pytest.raises(ValueError):
            validated_state(item, 4)
