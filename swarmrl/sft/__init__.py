"""Supervised warm start on a task's demonstrations."""

from __future__ import annotations

from swarmrl.utils.lazy import lazy_exports

_EXPORTS = {"SFTConfig": "swarmrl.sft.config", "run_sft": "swarmrl.sft.train"}
__all__ = list(_EXPORTS)

__getattr__ = lazy_exports(_EXPORTS)
