"""Lazy package exports: importing a package (e.g. for its config) must not import torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(exports: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``name`` from ``exports[name]`` on first use."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(name)

    return __getattr__
