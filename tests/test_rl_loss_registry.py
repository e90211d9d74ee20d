"""The loss registry (``swarmrl.rl.losses``): every registered loss is complete, the config is checked against it,
a new loss is one module dropped into ``swarmrl/rl/losses/kinds/``, and no code outside a loss's module branches
on its name."""

from __future__ import annotations

import ast
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from swarmrl.rl.config import LossConfig
from swarmrl.rl.losses import kinds, registry
from swarmrl.rl.losses.base import ClipCounts, Loss
from swarmrl.rl.losses.objective import Objective
from swarmrl.rl.losses.policy import policy_loss
from swarmrl.rl.losses.registry import UnknownLoss, get_loss, loss_names, registered

PKG = Path(__file__).resolve().parents[1] / "swarmrl"

# the losses this checkout ships: a new loss adds its name here (and its module in swarmrl/rl/losses/kinds/)
SHIPPED = {"grpo", "dr_grpo", "dapo", "gspo", "cispo", "rloo"}

# a source in a docstring: a year, and authors ("et al.", a lab) or a quoted title
_SOURCE = re.compile(r"\b(19|20)\d\d\b")


def check_complete(name: str, loss: Loss) -> None:
    """What every registered loss must have: name, defaults (LossConfig fields, valid values), advantage rule,
    ratio, token objective, clip counts, and a docstring of its own naming its source."""
    assert isinstance(loss, Loss) and loss.name == name, (name, loss)
    doc = type(loss).__dict__.get("__doc__") or ""
    assert _SOURCE.search(doc) and ("et al." in doc or '"' in doc), f"{name}: its docstring names no source paper"
    # defaults: LossConfig fields, values the field accepts, applied when the config leaves them unset
    fields = set(LossConfig.model_fields) - {"kind"}
    assert set(loss.defaults) <= fields, (name, set(loss.defaults) - fields)
    cfg = LossConfig(kind=name)
    assert LossConfig.model_validate({"kind": name, **loss.defaults}) == cfg
    for k, v in loss.defaults.items():
        assert getattr(cfg, k) == v, (name, k)
    # advantage rule: one finite number per reward, centred, zero for a tied group
    for use_std in (True, False):
        adv = loss.advantages([1.0, 0.0, 0.0, 1.0, 0.5], use_std)
        assert len(adv) == 5 and all(math.isfinite(a) for a in adv) and abs(sum(adv)) < 1e-9, (name, adv)
        assert loss.advantages([0.3, 0.3, 0.3], use_std) == pytest.approx([0.0] * 3)
    # ratio, objective and clip counts on a small batch: the right shapes, finite, a gradient, 0/1 counts
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(2, 5, generator=g)).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0]])
    a = torch.tensor([[0.7], [-0.4]]).expand(2, 5)
    obj = cfg.objective()
    r = loss.ratio((logp - logp.detach() + 0.1 * torch.randn(2, 5, generator=g)) * mask, mask)
    assert r.shape == logp.shape and bool(torch.isfinite(r).all())
    per_token = loss.token_objective(obj, r, a, logp)
    assert per_token.shape == logp.shape and bool(torch.isfinite(per_token).all())
    (per_token * mask).sum().backward()
    assert logp.grad is not None and bool(logp.grad.abs().sum() > 0)
    clips = loss.clip_counts(obj, r.detach(), a, mask)
    assert isinstance(clips, ClipCounts)
    for c in clips:
        assert c.shape == mask.shape and set(c.flatten().tolist()) <= {0.0, 1.0} and not bool((c * (1 - mask)).any())


def test_the_shipped_losses_are_registered():
    assert set(loss_names()) == SHIPPED
    assert loss_names() == sorted(loss_names())  # name order: the same list on every machine


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_registered_loss_is_complete(name):
    check_complete(name, get_loss(name))


def test_an_unknown_kind_is_refused_naming_the_known_ones():
    with pytest.raises(ValidationError, match="unknown loss kind 'ppo'") as e:
        LossConfig(kind="ppo")
    assert all(n in str(e.value) for n in SHIPPED)
    with pytest.raises(UnknownLoss, match="known kinds are"):
        policy_loss(Objective(kind="ppo"), torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1),
                    torch.ones(1, 1))


_NEW_LOSS = '''"""``reinforce``: a test's loss."""

from swarmrl.rl.losses.advantages import group_advantages
from swarmrl.rl.losses.base import ClipCounts, Loss


class Reinforce(Loss):
    """REINFORCE (Williams 1992, "Simple Statistical Gradient-Following Algorithms"): -A logp per token."""

    name = "reinforce"
    defaults = {"use_std": False, "normalization": "sequence"}

    def advantages(self, rewards, use_std):
        return group_advantages(rewards, use_std=use_std)

    def token_objective(self, obj, ratio, a, logp):
        return -a * logp

    def clip_counts(self, obj, r, a, mask):
        zero = mask.new_zeros(mask.shape)
        return ClipCounts(zero, zero, zero)


LOSS = Reinforce()
'''


@pytest.fixture
def dropped_in(tmp_path, monkeypatch):
    """A directory whose modules join ``swarmrl.rl.losses.kinds`` (as files dropped into the package would),
    the registry rediscovered before and after."""
    monkeypatch.setattr(kinds, "__path__", [*kinds.__path__, str(tmp_path)])
    registered.cache_clear()
    yield tmp_path
    registered.cache_clear()
    for name in [m for m in sys.modules if m.startswith(f"{kinds.__name__}.") and m.rsplit(".", 1)[1] in
                 {p.stem for p in tmp_path.glob("*.py")}]:
        del sys.modules[name]


def test_a_loss_module_dropped_into_the_package_is_registered(dropped_in):
    (dropped_in / "reinforce.py").write_text(_NEW_LOSS)
    assert set(loss_names()) == SHIPPED | {"reinforce"}
    check_complete("reinforce", get_loss("reinforce"))
    cfg = LossConfig(kind="reinforce")
    assert cfg.normalization == "sequence" and not cfg.use_std
    assert cfg.advantages([1.0, 0.0]) == [0.5, -0.5]
    # the loss computes its own objective: -A logp, weighted
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    out = policy_loss(cfg.objective(), logp, logp.detach(), torch.tensor([2.0]), torch.full((1, 2), 0.5),
                      torch.ones(1, 2))
    assert out.loss.item() == pytest.approx(3.0) and out.stats.clip_frac == 0.0
    out.loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-1.0, -1.0])


def test_a_module_without_a_proper_loss_is_refused_by_name(dropped_in):
    (dropped_in / "broken.py").write_text('"""No LOSS here."""\n')
    with pytest.raises(TypeError, match="broken defines no LOSS"):
        registry.registered()
    (dropped_in / "broken.py").unlink()
    del sys.modules[f"{kinds.__name__}.broken"]
    registered.cache_clear()
    (dropped_in / "misnamed.py").write_text(_NEW_LOSS)
    with pytest.raises(ValueError, match="named 'reinforce'; a loss takes its module's name"):
        registry.registered()


def test_the_registry_and_the_config_load_no_torch():
    """The config checks ``kind`` and applies a loss's defaults from the registry: ``swarmrl run --print-config``
    must stay light, so the registry, the base and every loss module import no torch."""
    code = ("import sys\nfrom swarmrl.rl.config import LossConfig\nfrom swarmrl.rl.losses.registry import loss_names\n"
            "names = loss_names()\nassert [LossConfig(kind=n).kind for n in names] == names\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def _kind_comparisons(path: Path, names: set[str]) -> list[str]:
    """Comparisons of something named ``kind`` with a loss's name in ``path``: ``obj.kind == "gspo"``,
    ``kind in ("gspo", "cispo")``."""

    def is_kind(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "kind") or (isinstance(node, ast.Name)
                                                                              and node.id == "kind")

    def strings(node: ast.AST) -> set[str]:
        return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(is_kind(s) for s in sides) and any(strings(s) & names for s in sides if not is_kind(s)):
                found.append(f"{path}:{node.lineno}")
    return found


def test_no_code_outside_a_loss_module_branches_on_its_name(tmp_path):
    """What a loss does lives in its module: nothing else asks which loss it is (a new loss then needs no edit
    elsewhere)."""
    kinds_dir = PKG / "rl" / "losses" / "kinds"
    found = [hit for p in sorted(PKG.rglob("*.py")) if kinds_dir not in p.parents
             for hit in _kind_comparisons(p, SHIPPED)]
    assert not found, found
    probe = tmp_path / "probe.py"  # the scan sees a branch when there is one
    probe.write_text("def f(obj, kind):\n    return obj.kind == 'gspo' or kind in ('cispo',) or obj.kind == 'x'\n")
    assert len(_kind_comparisons(probe, SHIPPED)) == 2
