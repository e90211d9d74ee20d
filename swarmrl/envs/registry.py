"""Environments by name: ``register_env`` (a decorator on a factory) and ``make_env``. The built-in modules
register themselves when the ``swarmrl.envs`` package is imported.

``mark_unavailable`` names tasks that exist upstream but are refused here, with the reason (reasoning-gym datasets
whose scorer would run a completion as code): asking for one says why instead of "unknown"."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from swarmrl.envs.base import Environment

_REGISTRY: dict[str, Callable[..., Environment]] = {}
_UNAVAILABLE: dict[str, str] = {}


def register_env(name: str) -> Callable[[Callable[..., Environment]], Callable[..., Environment]]:
    def deco(factory: Callable[..., Environment]) -> Callable[..., Environment]:
        if name in _REGISTRY or name in _UNAVAILABLE:
            raise ValueError(f"environment {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory

    return deco


def mark_unavailable(name: str, why: str) -> None:
    if name in _REGISTRY or name in _UNAVAILABLE:
        raise ValueError(f"environment {name!r} registered twice")
    _UNAVAILABLE[name] = why


def available_envs() -> list[str]:
    return sorted(_REGISTRY)


def _unknown(name: str) -> str:
    # ~100 names are registered (reasoning-gym's): the close ones help, the whole list does not
    import difflib  # noqa: PLC0415  # lazy: only a misspelt name needs it

    close = difflib.get_close_matches(name, list(_REGISTRY), n=5, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return f"unknown task {name!r}; {hint}`swarmrl tasks` lists the {len(_REGISTRY)} available"


def make_env(name: str, **params: Any) -> Environment:
    if name in _UNAVAILABLE:
        raise KeyError(f"task {name!r} is not available: {_UNAVAILABLE[name]}")
    if name not in _REGISTRY:
        raise KeyError(_unknown(name))
    try:
        return _REGISTRY[name](**params)
    except TypeError as e:
        raise ValueError(f"bad parameters for task {name!r}: {e}") from None
