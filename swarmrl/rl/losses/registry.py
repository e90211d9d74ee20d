"""The registered losses: every module of ``swarmrl.rl.losses.kinds``, found by walking that package
(``pkgutil``), so a new loss is one new module there. ``LossConfig.kind`` is checked against it (``get_loss``:
an unknown name is refused with the list of known ones). Importing it, or discovering the losses, loads no torch.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Mapping
from types import MappingProxyType

from swarmrl.rl.losses import kinds
from swarmrl.rl.losses.base import Loss


class UnknownLoss(ValueError):
    """A loss name no module of ``swarmrl.rl.losses.kinds`` defines."""


@functools.cache
def registered() -> Mapping[str, Loss]:
    """Every loss, by name, in name order: the ``LOSS`` of each module of ``kinds`` (named as the module)."""
    found: dict[str, Loss] = {}
    for info in sorted(pkgutil.iter_modules(kinds.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{kinds.__name__}.{info.name}")
        loss = getattr(module, "LOSS", None)
        if not isinstance(loss, Loss):
            raise TypeError(f"{module.__name__} defines no LOSS (an instance of swarmrl.rl.losses.base.Loss)")
        if loss.name != info.name:
            raise ValueError(f"{module.__name__}: its loss is named {loss.name!r}; a loss takes its module's name")
        found[loss.name] = loss
    return MappingProxyType(found)


def loss_names() -> list[str]:
    """The registered losses' names (the values ``rl.loss.kind`` takes)."""
    return list(registered())


def get_loss(name: str) -> Loss:
    """The loss named ``name``; ``UnknownLoss`` (a ``ValueError``) naming the known ones otherwise."""
    losses = registered()
    if name not in losses:
        raise UnknownLoss(f"unknown loss kind {name!r}: the known kinds are {', '.join(losses)} "
                          "(one module each in swarmrl/rl/losses/kinds/)")
    return losses[name]
