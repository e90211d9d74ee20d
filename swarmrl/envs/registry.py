"""Environments by name: ``register_env`` (a decorator on a factory) and ``make_env``. The built-in modules
register themselves when the ``swarmrl.envs`` package is imported.

``mark_unavailable`` names tasks that exist upstream but are refused here, with the reason (reasoning-gym datasets
whose scorer would run a completion as code): asking for one says why instead of "unknown".

``register_prefix`` names a family of tasks that cannot be listed ahead (``vf:<env_id>``: any installed verifiers
environment): ``make_env("vf:x", **params)`` calls the prefix's factory with ``"x"`` and the params."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from swarmrl.envs.base import Environment

_REGISTRY: dict[str, Callable[..., Environment]] = {}
_UNAVAILABLE: dict[str, str] = {}
_PREFIXES: dict[str, Callable[..., Environment]] = {}


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


def register_prefix(prefix: str, factory: Callable[..., Environment]) -> None:
    """``factory(rest, **params)`` builds the task ``prefix + rest`` (``rest`` not empty)."""
    if not prefix.endswith(":") or prefix in _PREFIXES or any(n.startswith(prefix) for n in _REGISTRY):
        raise ValueError(f"task prefix {prefix!r} registered twice or not ending in ':'")
    _PREFIXES[prefix] = factory


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
    prefix = next((p for p in _PREFIXES if name.startswith(p) and len(name) > len(p)), None)
    if name not in _REGISTRY and prefix is None:
        raise KeyError(_unknown(name))
    try:
        if prefix is not None:
            return _PREFIXES[prefix](name[len(prefix):], **params)
        return _REGISTRY[name](**params)
    except TypeError as e:
        raise ValueError(f"bad parameters for task {name!r}: {e}") from None
