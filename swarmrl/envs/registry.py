"""Environments by name: ``register_env`` (a decorator on a factory) and ``make_env``. The built-in modules
register themselves when the ``swarmrl.envs`` package is imported.

``mark_unavailable`` names tasks that exist upstream but are refused here, with the reason (reasoning-gym datasets
whose scorer would run a completion as code): asking for one says why instead of "unknown".

Installed packages bring their own environments through the entry-point group ``swarmrl.envs``: an entry point
named ``NAME`` pointing at a factory (``pkg.module:make``, called with the task's params and returning an
``Environment``) makes ``NAME`` a task like the built-in ones, in every process that has the package (trainer,
workers, nodes and the validator must all have it, since the validator re-runs the verifier and the environment's
replies). A built-in name is never replaced by a plugin.

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


PLUGIN_GROUP = "swarmrl.envs"


def _plugins() -> dict[str, Any]:
    from importlib.metadata import entry_points  # noqa: PLC0415  # lazy: only a name not built in needs it

    return {ep.name: ep for ep in entry_points(group=PLUGIN_GROUP)}


def _load_plugin(name: str) -> bool:
    """Registers the installed entry point ``name`` of ``swarmrl.envs``; False when there is none."""
    ep = _plugins().get(name)
    if ep is None:
        return False
    try:
        factory = ep.load()
    except Exception as e:  # noqa: BLE001  # a broken plugin is the user's to fix: say which and why
        raise ImportError(f"task {name!r}: its plugin {ep.value!r} (entry point group {PLUGIN_GROUP!r}) does not "
                          f"load: {type(e).__name__}: {e}") from e
    if not callable(factory):
        raise TypeError(f"task {name!r}: plugin {ep.value!r} is not a factory")
    _REGISTRY[name] = factory
    return True


def register_prefix(prefix: str, factory: Callable[..., Environment]) -> None:
    """``factory(rest, **params)`` builds the task ``prefix + rest`` (``rest`` not empty)."""
    if not prefix.endswith(":") or prefix in _PREFIXES or any(n.startswith(prefix) for n in _REGISTRY):
        raise ValueError(f"task prefix {prefix!r} registered twice or not ending in ':'")
    _PREFIXES[prefix] = factory


def available_envs() -> list[str]:
    return sorted(set(_REGISTRY) | set(_plugins()))


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
    if name not in _REGISTRY and prefix is None and not _load_plugin(name):
        raise KeyError(_unknown(name))
    try:
        env = _PREFIXES[prefix](name[len(prefix):], **params) if prefix is not None else _REGISTRY[name](**params)
    except TypeError as e:
        raise ValueError(f"bad parameters for task {name!r}: {e}") from None
    if not isinstance(env, Environment):
        raise TypeError(f"task {name!r}: its factory returned {type(env).__name__}, not an Environment")
    return env
