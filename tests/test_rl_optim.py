"""The trainer's optimizer (swarmrl.training.optim): the low-memory AdamW makes torch's AdamW update, in float32 to
rounding and with bfloat16 moments or gradients to bfloat16's precision; its gradients live off ``param.grad``,
are clipped by the global norm and summed over micro-batches; a trainer with bfloat16 state saves and resumes it."""

from __future__ import annotations

import pytest
import torch

import swarmrl.training.optim as optim
from swarmrl.training.optim import LowMemoryAdamW, build_optimizer, clip_gradients

torch.set_num_threads(1)


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 33), torch.nn.Linear(33, 7))


def _loss(m: torch.nn.Module, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 50, (12,), generator=g)
    return (m(x) ** 2).mean() * 40  # gradients large enough that a clip at 1 bites


def _train(opt_for, steps: int = 6, clip: float | None = None, micro: int = 1) -> tuple[torch.nn.Module, list]:
    m = _model()
    opt = opt_for(m.parameters())
    norms = []
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        for k in range(micro):
            _loss(m, 100 * s + k).backward()
        if clip is not None:
            norms.append(clip_gradients(m.parameters(), opt, clip))
        opt.step()
    return m, norms


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)


def _low(state: torch.dtype, grad: torch.dtype):
    return lambda params: LowMemoryAdamW(params, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, state_dtype=state,
                                         grad_dtype=grad)


def _max_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    with torch.no_grad():
        return max(float((p - q).abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def _moved(a: torch.nn.Module) -> float:
    return _max_diff(a, _model())


def test_float32_state_makes_torchs_update_across_chunk_boundaries(monkeypatch):
    monkeypatch.setattr(optim, "CHUNK", 7)  # every tensor is split into slices, some ragged
    ref, ref_norms = _train(_adamw, clip=1.0)
    ours, our_norms = _train(_low(torch.float32, torch.float32), clip=1.0)
    assert _moved(ref) > 0.03  # the steps did something
    assert _max_diff(ref, ours) < 1e-6
    assert our_norms == pytest.approx(ref_norms, rel=1e-6) and max(ref_norms) > 1.0


def test_bfloat16_moments_and_gradients_stay_within_bfloat16_precision_of_torch():
    ref, ref_norms = _train(_adamw, clip=1.0, micro=2)
    for state, grad in ((torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16),
                        (torch.bfloat16, torch.bfloat16)):
        ours, norms = _train(_low(state, grad), clip=1.0, micro=2)
        assert _max_diff(ref, ours) < 0.05 * _moved(ref), (state, grad)  # the same update, to a few percent
        assert norms == pytest.approx(ref_norms, rel=2e-2)


def test_bfloat16_gradients_live_off_the_parameters_and_are_summed_over_micro_batches():
    m = _model()
    opt = LowMemoryAdamW(m.parameters(), lr=1e-2, grad_dtype=torch.bfloat16)
    _loss(m, 1).backward()
    assert all(p.grad is None for p in m.parameters())
    assert all(g.dtype == torch.bfloat16 for g in opt.grads.values()) and len(opt.grads) == 5
    _loss(m, 2).backward()  # a second micro-batch: added to the buffers

    ref = _model()
    _loss(ref, 1).backward()
    _loss(ref, 2).backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        assert float((opt.grads[p].float() - q.grad).abs().max()) <= 1e-2 * float(q.grad.abs().max())
    assert opt.grad_norm() == pytest.approx(float(torch.nn.utils.clip_grad_norm_(ref.parameters(), 1e9)), rel=1e-2)
    opt.zero_grad()
    assert not opt.grads and float(opt.grad_norm()) == 0.0
    _loss(m, 3).backward()  # the next step's: the norm is this step's own
    ref.zero_grad()
    _loss(ref, 3).backward()
    assert opt.grad_norm() == pytest.approx(float(torch.nn.utils.clip_grad_norm_(ref.parameters(), 1e9)), rel=1e-2)


def test_a_nonfinite_gradient_is_reported_and_not_scaled():
    def stepped(clip: bool) -> tuple[torch.nn.Module, float | None]:
        m = _model()
        opt = LowMemoryAdamW(m.parameters(), lr=1e-2, grad_dtype=torch.bfloat16)
        (_loss(m, 1) + m[2].bias[0] * float("nan")).backward()  # one gradient element is NaN, the rest large
        norm = opt.clip_(1.0) if clip else None
        opt.step()
        return m, norm

    clipped, norm = stepped(True)
    plain, _ = stepped(False)
    assert norm != norm  # NaN, reported
    for p, q in zip(clipped.parameters(), plain.parameters()):  # and no scale applied to the others
        torch.testing.assert_close(p, q, rtol=0, atol=0, equal_nan=True)
    assert _moved(clipped) > 1e-3


def test_a_clip_is_applied_by_the_step_as_if_the_gradients_were_scaled():
    def stepped(scale_first: bool) -> tuple[torch.nn.Module, LowMemoryAdamW]:
        m = _model()
        opt = LowMemoryAdamW(m.parameters(), lr=1e-2, state_dtype=torch.float32, grad_dtype=torch.bfloat16)
        _loss(m, 1).backward()
        if scale_first:  # what torch's clip does: the gradients themselves scaled
            norm = float(opt.grad_norm())
            for g in opt.grads.values():
                g.mul_(0.5 / (norm + 1e-6))
        else:
            assert opt.clip_(0.5) > 5  # the step will scale by less than a tenth
        opt.step()
        return m, opt

    (ref, ref_opt), (ours, opt) = stepped(True), stepped(False)
    assert _max_diff(ref, ours) < 1e-3 * _moved(ref)
    for p, q in zip(ref.parameters(), ours.parameters()):  # the moments saw the scaled gradient (Adam's first
        # update alone would not show a scale)
        torch.testing.assert_close(opt.state[q]["exp_avg"], ref_opt.state[p]["exp_avg"], rtol=1e-2, atol=1e-7)


def test_the_moments_are_bfloat16_and_half_the_bytes():
    m = _model()
    opt = LowMemoryAdamW(m.parameters(), state_dtype=torch.bfloat16)
    _loss(m, 0).backward()
    opt.step()
    st = [opt.state[p] for p in m.parameters()]
    assert all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.bfloat16 for s in st)
    assert sum(s["exp_avg"].nbytes for s in st) * 2 == sum(p.nbytes for p in m.parameters())


def test_build_optimizer_picks_fused_adamw_for_float32_and_refuses_bfloat16_when_sharded():
    params = list(_model().parameters())
    opt = build_optimizer(params, 1e-3, (0.9, 0.99), 0.0)
    assert type(opt) is torch.optim.AdamW and opt.defaults["fused"]
    low = build_optimizer(params, 1e-3, (0.9, 0.99), 0.0, state_dtype="bfloat16")
    assert isinstance(low, LowMemoryAdamW) and not low.holds_grads
    with pytest.raises(ValueError, match="fsdp2"):
        build_optimizer(params, 1e-3, (0.9, 0.99), 0.0, grad_dtype="bfloat16", sharded=True)
    with pytest.raises(ValueError, match="one trainer process"):
        build_optimizer(params, 1e-3, (0.9, 0.99), 0.0, grad_dtype="bfloat16", world=2)
    with pytest.raises(ValueError, match="float32"):
        LowMemoryAdamW([torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_step_is_seen_by_what_caches_work_on_the_weights(tiny_model_dir, dtype):
    """The fused kernel writes the weights without bumping their version counters: the trainer's in-process
    evaluations sampled from the static decoder's copies of the weights before the first step (the main job's
    held-out curve stayed flat while the final evaluation, from the saved weights, had learned)."""
    from swarmrl.inference.static_decoder import StaticDecoder
    from swarmrl.models.io import load_model

    model = load_model(tiny_model_dir)
    opt = build_optimizer(model.parameters(), 1e-2, (0.9, 0.99), 0.0, state_dtype=dtype, grad_dtype=dtype)
    before = StaticDecoder.for_model(model)
    assert StaticDecoder.for_model(model) is before  # unchanged weights: the same copies
    model(input_ids=torch.tensor([[5, 6, 7, 8]])).logits.float().square().mean().backward()
    opt.step()
    assert StaticDecoder.for_model(model) is not before


def test_a_trainer_with_bfloat16_state_and_gradients_trains_saves_and_resumes(tmp_path, tiny_model_dir):
    from test_rl_trainer_parts import MemorySource, _cfg

    from swarmrl.rl.config import OptimConfig
    from swarmrl.rl.trainer import Trainer

    low = OptimConfig(lr=1e-3, state_dtype="bfloat16", grad_dtype="bfloat16", activation_checkpointing=True)
    t = Trainer(_cfg(tmp_path, tiny_model_dir, 2, optim=low), source=MemorySource(2), publishers=[])
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    assert t.run_loop() == 2
    assert any(not torch.equal(before[n], p) for n, p in t.model.named_parameters())  # it trained
    assert all(p.grad is None for p in t.model.parameters()) and not t.opt.grads  # no gradient held after a step
    saved = t.opt.state_dict()["state"]
    assert all(s["exp_avg_sq"].dtype == torch.bfloat16 for s in saved.values())

    again = Trainer(_cfg(tmp_path, tiny_model_dir, 3, optim=low), source=MemorySource(3), publishers=[])
    assert again.resumed and again.step == 2
    back = again.opt.state_dict()["state"]
    assert back.keys() == saved.keys()
    assert all(back[k][m].dtype == torch.bfloat16 and torch.equal(back[k][m], saved[k][m])
               for k in saved for m in ("exp_avg", "exp_avg_sq"))


def test_a_checkpoint_of_another_state_dtype_loads_into_this_one():
    m = _model()
    full = LowMemoryAdamW(m.parameters(), state_dtype=torch.float32)
    _loss(m, 0).backward()
    full.step()
    low = LowMemoryAdamW(m.parameters(), state_dtype=torch.bfloat16)
    low.load_state_dict(full.state_dict())
    for p in m.parameters():
        assert low.state[p]["exp_avg"].dtype == torch.bfloat16
        torch.testing.assert_close(low.state[p]["exp_avg"].float(), full.state[p]["exp_avg"], rtol=1e-2, atol=1e-6)


def test_peak_rss_is_this_programs_own_not_a_large_parents():
    """A process started (fork, exec) by a parent holding ~300 MB reports its own peak, where ru_maxrss reports
    at least the parent's size (Linux carries it across exec): what inflated trainers started by a benchmark."""
    import subprocess
    import sys

    from swarmrl.utils.memory import peak_rss_mb

    assert 10 < peak_rss_mb() < 100_000
    child = ("import resource; from swarmrl.utils.memory import peak_rss_mb; "
             "print(peak_rss_mb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")
    code = ("import subprocess, sys\n"
            "big = bytearray(300 * 2**20)\n"
            "for i in range(0, len(big), 4096): big[i] = 1\n"
            f"print(subprocess.run([sys.executable, '-c', {child!r}], capture_output=True, text=True,"
            " check=True).stdout)\n")
    own, inherited = map(float, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                               check=True).stdout.split())
    assert own < 200 < inherited
