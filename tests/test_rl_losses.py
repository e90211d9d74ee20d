"""The loss family (``loss.kind``) and the off-policy correction (``loss.correction``): each kind's defining
property on hand-made tensors, no overflow on extreme logprobs, and the trainer's mismatch KL ~0 when inference
and trainer run the same weights in float32."""

from __future__ import annotations

import math

import pytest
import torch

from swarmrl.contract import RLContract
from swarmrl.envs import make_env
from swarmrl.envs.config import TaskConfig
from swarmrl.generation.batch import BatchOrigin, rollout_batch
from swarmrl.models.io import load_model, load_tokenizer
from swarmrl.rl.config import EvalSection, LossConfig, RLConfig
from swarmrl.rl.losses.advantages import group_advantages
from swarmrl.rl.losses.objective import Objective
from swarmrl.rl.losses.policy import policy_loss
from swarmrl.rl.losses.registry import loss_names
from swarmrl.rl.trainer import Trainer
from swarmrl.rollouts.wire import write_rollouts
from swarmrl.rundir import read_trainer_log
from swarmrl.rundir.writer import RunDir

KINDS = loss_names()


def _obj(kind: str = "grpo", **kw) -> Objective:
    return LossConfig(kind=kind, **kw).objective()


def _run(obj: Objective, log_ratios: list[float], adv: float = 1.0, old: float = -1.0):
    """One sequence whose tokens have these log(pi_theta / pi_infer); returns the loss and d loss / d logp."""
    logp = torch.tensor([[old + x for x in log_ratios]], dtype=torch.float32, requires_grad=True)
    n = len(log_ratios)
    out = policy_loss(obj, logp, torch.full((1, n), old), torch.tensor([adv]), torch.full((1, n), 1.0 / n),
                      torch.ones(1, n))
    out.loss.backward()
    return out, logp.grad[0].tolist()


@pytest.mark.parametrize("kind", KINDS)
def test_on_policy_every_kind_is_the_policy_gradient(kind):
    """At ratio 1 (trainer = inference) every objective's gradient is -A x weight per token."""
    out, grad = _run(_obj(kind), [0.0, 0.0, 0.0, 0.0], adv=0.5)
    assert grad == pytest.approx([-0.5 / 4] * 4)
    assert out.stats.mismatch_kl == 0.0 and out.stats.clip_frac == 0.0 and out.stats.tokens == 4


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("correction", ["none", "tis", "mis"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_no_overflow_on_extreme_logprobs(kind, correction, level):
    obj = _obj(kind, correction=correction, correction_level=level)
    for adv in (1.0, -1.0):
        out, grad = _run(obj, [1000.0, -1000.0, 80.0, -80.0], adv=adv, old=-5.0)
        assert math.isfinite(out.loss.item()) and all(math.isfinite(g) for g in grad), (kind, correction, grad)
        assert all(math.isfinite(v) for v in out.stats.as_dict().values())


def test_dapo_clips_higher_than_grpo():
    r = math.log(1.25)  # ratio 1.25 with A > 0: past grpo's 1.2, inside dapo's 1.28
    _, g_grpo = _run(_obj("grpo"), [r])
    _, g_dapo = _run(_obj("dapo"), [r])
    assert g_grpo == [0.0] and g_dapo[0] == pytest.approx(-1.25)
    assert LossConfig(kind="dapo").overlong_filter and LossConfig(kind="dapo", clip_eps_high=0.3).clip_eps_high == 0.3


def test_gspo_clips_the_sequence_ratio_not_the_tokens():
    # token ratios e^0.5 and e^-0.5: each far outside the clip, the sequence's (their geometric mean) exactly 1
    out, grad = _run(_obj("gspo"), [0.5, -0.5])
    assert out.stats.clip_frac == 0.0 and grad == pytest.approx([-0.5, -0.5])
    out, grad = _run(_obj("gspo"), [0.5, 0.5])  # the sequence ratio e^0.5 > 1 + 4e-4: clipped, no gradient
    assert grad == [0.0, 0.0] and out.stats.clip_frac == 1.0


def test_cispo_keeps_the_gradient_of_clipped_tokens():
    r = math.log(2.0)
    _, g_grpo = _run(_obj("grpo"), [r])
    _, g_cispo = _run(_obj("cispo"), [r])
    assert g_grpo == [0.0]  # the PPO clip drops the token
    assert g_cispo[0] == pytest.approx(-1.28)  # the weight is clipped to 1 + 0.28, the gradient flows


def test_rloo_and_dr_grpo_advantages():
    assert LossConfig(kind="rloo").advantages([1.0, 0.0, 0.0, 0.0]) == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    assert group_advantages([1.0, 0.0], use_std=False) == [0.5, -0.5]
    dr = LossConfig(kind="dr_grpo")
    assert dr.normalization == "constant" and not dr.use_std
    assert LossConfig(kind="dr_grpo", normalization="token").normalization == "token"  # set: kept


def test_truncated_and_masked_importance_weights():
    d = math.log(3.0)  # the trainer's policy gives the sampled tokens 3x the inference probability
    tis, g_tis = _run(_obj(correction="tis", tis_cap=2.0), [d, d])
    assert tis.stats.is_weight_mean == pytest.approx(2.0) and g_tis == pytest.approx([-1.0, -1.0])
    mis, g_mis = _run(_obj(correction="mis", mis_band=(0.5, 2.0)), [d, d])
    assert mis.stats.is_dropped_frac == 1.0 and g_mis == [0.0, 0.0]
    # sequence level: the product of the token weights, 9, truncated to the cap
    seq, _ = _run(_obj(correction="tis", tis_cap=4.0, correction_level="sequence"), [d, d])
    assert seq.stats.is_weight_mean == pytest.approx(4.0)
    ok, g_ok = _run(_obj(correction="mis"), [math.log(1.5)])  # inside the band: weight 1.5, ratio vs pi_prox 1
    assert ok.stats.is_dropped_frac == 0.0 and g_ok == pytest.approx([-1.5])
    assert ok.stats.mismatch_kl == pytest.approx(1.5 - 1 - math.log(1.5))


def test_the_trainer_sees_no_mismatch_with_its_own_samples(tmp_path, tiny_model_dir):
    """Rollouts sampled by the policy the trainer then trains (async 0, float32 on CPU): inference and trainer
    logprobs agree, so the step's mismatch KL is ~0."""
    torch.set_num_threads(1)
    contract = RLContract(task=TaskConfig(name="add", params={"digits": 2}), async_level=0, group_size=4,
                          filter_ties=False)
    cfg = RLConfig(run_dir=str(tmp_path / "run"), model=str(tiny_model_dir), contract=contract, steps=1,
                   prompts_per_step=4, eval=EvalSection(every_steps=0, n=2, max_new_tokens=2),
                   loss=LossConfig(correction="tis"))
    model, tok = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    env = make_env("add", digits=2)
    res = rollout_batch(model, tok, env, env.sample(1, 4), contract=cfg.contract, sampling=cfg.contract.sampling,
                        origin=BatchOrigin("w0", 0, 0, 1),
                        budgets=None, generator=torch.Generator().manual_seed(0))
    run = RunDir(cfg.run_dir)
    write_rollouts(res.rows, run.new_rollout_path(0, "w0", 4))
    t = Trainer(cfg)
    assert t.run_loop() == 1
    (rec,) = read_trainer_log(run.trainer_metrics).steps
    assert 0.0 <= rec.mismatch_kl < 1e-5 and rec.is_weight_mean == pytest.approx(1.0, abs=1e-3)
