"""Inference: batched sampling with KV cache, per-token logprobs and final-norm hidden-state capture."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"SamplingParams": "swarmrl.inference.params", "SampleOutput": "swarmrl.inference.sampler",
            "generate": "swarmrl.inference.sampler"}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(name)
