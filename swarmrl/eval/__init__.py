"""Held-out evaluation: greedy, batched, KV cache."""

from __future__ import annotations

from swarmrl.utils.lazy import lazy_exports

_EXPORTS = {"EvalConfig": "swarmrl.eval.config", "evaluate": "swarmrl.eval.heldout",
            "evaluate_path": "swarmrl.eval.heldout"}
__all__ = list(_EXPORTS)

__getattr__ = lazy_exports(_EXPORTS)
