"""LoRA policies in the trainer (``rl.lora``): only the adapter trains, each version is the adapter alone (a few KB
on the tiny model), a holder applying it reproduces the trainer's logits, and a resumed run goes on exactly where
it stopped."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file
from test_rl_trainer_parts import CountingPublisher, MemorySource, _cfg

from swarmrl.models.adapter_file import ADAPTER_FILE, BASE_MARKER
from swarmrl.policy.holder import PolicyHolder
from swarmrl.policy.sources import RunDirPolicySource
from swarmrl.rl.config import LoraSection, LossConfig, OptimConfig, RLConfig, TrainerSection
from swarmrl.rl.trainer import Trainer
from swarmrl.training.checkpoint import read_saved_state

torch.set_num_threads(1)
LORA = LoraSection(enabled=True, rank=2, alpha=4.0, target_modules=["q_proj", "v_proj"])
IDS = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])


def _trainer(tmp_path: Path, model: Path, steps: int, lora: LoraSection = LORA, **kw) -> tuple[Trainer, CountingPublisher]:
    pub = CountingPublisher()
    cfg = _cfg(tmp_path, model, steps, lora=lora, optim=OptimConfig(lr=1e-2, warmup_steps=0), **kw)
    return Trainer(cfg, source=MemorySource(steps), publishers=[pub]), pub


def _logits(model: torch.nn.Module) -> torch.Tensor:
    was = model.training
    model.eval()
    with torch.no_grad():
        out = model(input_ids=IDS).logits
    model.train(was)
    return out


def test_lora_trains_only_the_adapter_and_publishes_a_few_kb(tmp_path, tiny_model_dir):
    t, pub = _trainer(tmp_path, tiny_model_dir, 3)
    base = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    opt_params = {id(p) for g in t.opt.param_groups for p in g["params"]}
    named = dict(t.model.named_parameters())
    assert opt_params == {id(p) for n, p in named.items() if ".lora_" in n}  # the adapter alone, all of it
    assert all(not p.requires_grad for n, p in named.items() if ".lora_" not in n)
    before = _logits(t.model)
    assert t.run_loop() == 3
    for n, p in named.items():  # the base weights did not move
        if ".lora_" not in n:
            key = n.replace(".base_layer.", ".")
            if key in base:
                assert torch.equal(p.detach(), base[key]), n
    assert (_logits(t.model) - before).abs().max() > 1e-3  # the adapter did
    full = (Path(tiny_model_dir) / "model.safetensors").stat().st_size
    assert pub.bytes[0] == full  # version 0 is the base itself
    assert all(0 < pub.bytes[v] < 8_000 for v in (1, 2, 3)), pub.bytes  # versions after it: the adapter alone
    v3 = t.run.version_dir(3)
    assert (v3 / ADAPTER_FILE).is_file() and (v3 / BASE_MARKER).is_file() and not (v3 / "model.safetensors").exists()


def test_a_holder_applying_the_adapter_reproduces_the_trainers_logits(tmp_path, tiny_model_dir):
    t, _ = _trainer(tmp_path, tiny_model_dir, 2)
    t.run_loop()
    holder = PolicyHolder(RunDirPolicySource(t.run.root), tiny_model_dir)
    merged = holder.load(2)
    trainer_logits = _logits(t.model)
    assert (_logits(merged) - trainer_logits).abs().max() < 1e-5
    assert (_logits(holder.load(0)) - trainer_logits).abs().max() > 1e-3  # back to the base: not the adapter's
    assert (_logits(holder.load(2)) - trainer_logits).abs().max() < 1e-5  # merged onto the base, not onto v0's


def test_lora_resume_goes_on_exactly(tmp_path, tiny_model_dir):
    straight, _ = _trainer(tmp_path / "a", tiny_model_dir, 4)
    straight.run_loop()
    first, _ = _trainer(tmp_path / "b", tiny_model_dir, 2)
    first.run_loop()
    saved = read_saved_state(first.run.version_dir(2))["trainer"]["optimizer"]["state"]
    assert saved and all(".lora_" in name for name in saved)  # the adapter's optimizer state, by name
    pub = CountingPublisher()
    src = MemorySource(4)
    resumed = Trainer(_cfg(tmp_path / "b", tiny_model_dir, 4, lora=LORA, optim=OptimConfig(lr=1e-2, warmup_steps=0)),
                      source=src, publishers=[pub])
    assert resumed.step == 2 and resumed.resumed
    assert (_logits(resumed.model) - _logits(first.model)).abs().max() < 1e-6  # v2's adapter back in place
    assert resumed.run_loop() == 4
    a = load_file(str(straight.run.version_dir(4) / ADAPTER_FILE))
    b = load_file(str(resumed.run.version_dir(4) / ADAPTER_FILE))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_the_kl_reference_is_the_base_with_the_adapter_off(tmp_path, tiny_model_dir):
    t, _ = _trainer(tmp_path, tiny_model_dir, 2, loss=LossConfig(kl_coef=0.1))
    t.run_loop()
    base = PolicyHolder(RunDirPolicySource(t.run.root), tiny_model_dir).load(0)
    with t.ref_model.disabled() as ref:
        assert (_logits(ref) - _logits(base)).abs().max() < 1e-5
    assert (_logits(t.model) - _logits(base)).abs().max() > 1e-3  # and the policy is back on afterwards


def test_bad_lora_settings_are_refused_clearly(tmp_path, tiny_model_dir):
    for bad in ({"rank": 0}, {"rank": 10_000}, {"alpha": 0}, {"dropout": 1.0}, {"target_modules": []},
                {"target_modules": ["q_proj", "q_proj"]}, {"target_modules": ["q proj"]}):
        with pytest.raises(ValidationError):
            LoraSection(enabled=True, **bad)
    with pytest.raises(ValidationError, match="fsdp2"):
        RLConfig(lora=LoraSection(enabled=True), trainer=TrainerSection(parallel="fsdp2"))
    with pytest.raises(ValueError, match=r"\['w_proj'\] not found in the model"):
        _trainer(tmp_path, tiny_model_dir, 1, lora=LoraSection(enabled=True, target_modules=["q_proj", "w_proj"]))


def test_the_sampler_applies_the_adapter_the_trainer_evaluates(tiny_model_dir):
    """The trainer's held-out evaluation samples its LoRA-wrapped model: the static decoder must apply the active
    adapter (it copied the base's weights alone, so every evaluation measured the base)."""
    from swarmrl.inference.backend import as_backend  # noqa: PLC0415
    from swarmrl.inference.params import SamplingParams  # noqa: PLC0415
    from swarmrl.inference.static_decoder import unsupported_reason  # noqa: PLC0415
    from swarmrl.models.io import load_model  # noqa: PLC0415
    from swarmrl.rl.lora import LoraPolicy  # noqa: PLC0415

    lp = LoraPolicy.wrap(load_model(tiny_model_dir), LoraSection(rank=4, alpha=8.0, target_modules=["q_proj", "o_proj",
                                                                                                  "down_proj"]))
    assert unsupported_reason(lp.model) is None  # the fast path, not HF's forward
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in lp.model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g))
    prompts = [[5, 6, 7], [9, 10, 11, 12]]
    params = SamplingParams(max_new_tokens=12, temperature=0.0)

    def greedy(model: torch.nn.Module) -> list[list[int]]:
        return as_backend(model, eos_id=-1, pad_id=0).generate(prompts, params, seeds=[0, 1]).completion_ids

    def hf_greedy(model: torch.nn.Module) -> list[list[int]]:  # HF's forward, one token at a time, no cache
        out = []
        with torch.no_grad():
            for p in prompts:
                ids = list(p)
                for _ in range(12):
                    ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
                out.append(ids[len(p):])
        return out

    lp.model.eval()
    adapted, base = greedy(lp.model), greedy(load_model(tiny_model_dir))
    assert adapted == hf_greedy(lp.model) and adapted != base
    with lp.peft.disable_adapter():  # switched off: the base again (no parameter changed, so the cache must see it)
        assert greedy(lp.model) == base
    assert greedy(lp.model) == adapted
