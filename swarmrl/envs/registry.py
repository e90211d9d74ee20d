"""Environments by name: ``register_env`` (a decorator on a factory) and ``make_env``. The built-in modules
register themselves when the ``swarmrl.envs`` package is imported."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from swarmrl.envs.base import Environment

_REGISTRY: dict[str, Callable[..., Environment]] = {}


def register_env(name: str) -> Callable[[Callable[..., Environment]], Callable[..., Environment]]:
    def deco(factory: Callable[..., Environment]) -> Callable[..., Environment]:
        if name in _REGISTRY:
            raise ValueError(f"environment {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory

    return deco


def available_envs() -> list[str]:
    return sorted(_REGISTRY)


def make_env(name: str, **params: Any) -> Environment:
    if name not in _REGISTRY:
        raise KeyError(f"unknown task {name!r}; available: {', '.join(sorted(_REGISTRY))}")
    try:
        return _REGISTRY[name](**params)
    except TypeError as e:
        raise ValueError(f"bad parameters for task {name!r}: {e}") from None
