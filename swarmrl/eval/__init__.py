"""Held-out evaluation: greedy, batched, KV cache."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"EvalConfig": "swarmrl.eval.config", "evaluate": "swarmrl.eval.heldout",
            "evaluate_path": "swarmrl.eval.heldout"}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(name)
