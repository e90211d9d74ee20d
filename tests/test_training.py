"""The shared training builders (swarmrl.training): the one learning-rate rule is the RL trainer's and SFT's warm-up
and DiLoCo's warm-up with cosine decay, to the last bit; its scheduler saves the state checkpoints always held;
DiLoCo's inner AdamW is torch's own, bit for bit; SFT's fused AdamW makes the update of the AdamW it had, to float
rounding; and SFT runs on the builders."""

from __future__ import annotations

import json
import math

import pytest
import torch

from swarmrl.models import ModelInitConfig
from swarmrl.sft import SFTConfig, run_sft
from swarmrl.training.optim import build_optimizer, clip_gradients
from swarmrl.training.schedule import build_scheduler, lr_factor

torch.set_num_threads(1)


def test_warmup_cosine_schedule():
    assert lr_factor(0, 10, 110) == pytest.approx(0.1)
    assert lr_factor(9, 10, 110) == pytest.approx(1.0)
    assert lr_factor(10, 10, 110) == pytest.approx(1.0)
    assert lr_factor(60, 10, 110, min_ratio=0.1) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert lr_factor(110, 10, 110, min_ratio=0.1) == pytest.approx(0.1)
    assert lr_factor(500, 10, 110, min_ratio=0.1) == pytest.approx(0.1)


def _old_warmup(s: int, warmup: int) -> float:  # the RL trainer's and SFT's lambda before the builders
    return min(1.0, (s + 1) / max(1, warmup))


def _old_warmup_cosine(step: int, warmup: int, total: int, min_ratio: float) -> float:  # DiLoCo's before
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def test_one_rule_gives_every_old_schedule_exactly():
    for warmup in range(7):
        for s in range(40):
            assert lr_factor(s, warmup) == _old_warmup(s, warmup)
            for total, ratio in ((30, 0.1), (3, 0.0), (600, 0.25)):
                assert lr_factor(s, warmup, total, ratio) == _old_warmup_cosine(s, warmup, total, ratio)


def test_the_scheduler_state_is_the_counters_alone():
    """A trainer's checkpoint holds the scheduler's state dict: no lambda state in it, as before."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.5)
    sched = build_scheduler(opt, 4)
    for _ in range(2):
        opt.step()
        sched.step()
    sd = sched.state_dict()
    assert sd["lr_lambdas"] == [None] and sd["last_epoch"] == 2
    assert sched.get_last_lr() == [0.5 * 3 / 4]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 33), torch.nn.Linear(33, 7))


def _steps(make, n: int = 5) -> torch.nn.Module:
    m = _model()
    opt = make(m.parameters())
    for s in range(n):
        g = torch.Generator().manual_seed(s)
        opt.zero_grad(set_to_none=True)
        (m(torch.randint(0, 50, (12,), generator=g)) ** 2).mean().mul(40).backward()
        clip_gradients(m.parameters(), opt, 1.0)
        opt.step()
    return m


def test_diloco_inner_adamw_is_torchs_own_bit_for_bit():
    ours = _steps(lambda ps: build_optimizer(ps, 1e-3, (0.9, 0.95), 0.1, fused=False))
    before = _steps(lambda ps: torch.optim.AdamW(ps, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1))
    opt = build_optimizer(_model().parameters(), 1e-3, (0.9, 0.95), 0.1, fused=False)
    assert not opt.defaults["fused"]
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), before.parameters()))


def test_sft_fused_adamw_makes_the_old_update_to_float_rounding():
    ours = _steps(lambda ps: build_optimizer(ps, 2e-3, (0.9, 0.999), 0.0))
    before = _steps(lambda ps: torch.optim.AdamW(ps, lr=2e-3, weight_decay=0.0))  # SFT's before the builders
    assert build_optimizer(_model().parameters(), 2e-3, (0.9, 0.999), 0.0).defaults["fused"]
    diff = max(float((a - b).detach().abs().max()) for a, b in zip(ours.parameters(), before.parameters()))
    assert diff < 1e-6, diff


def test_sft_trains_and_saves_on_the_builders(tmp_path):
    cfg = SFTConfig(init=ModelInitConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64),
                    out=str(tmp_path / "sft"), minutes=None, steps=3, batch_size=4, warmup_steps=2,
                    eval_at_minutes=[], eval_n=4, threads=1)
    summary = run_sft(cfg)
    assert summary["steps"] == 3 and (tmp_path / "sft" / "model" / "config.json").is_file()
    rows = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3] and all(math.isfinite(r["loss"]) for r in rows
                                                                        if "loss" in r)
