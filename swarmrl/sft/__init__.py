"""Supervised warm start on a task's demonstrations."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"SFTConfig": "swarmrl.sft.config", "run_sft": "swarmrl.sft.train"}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(name)
