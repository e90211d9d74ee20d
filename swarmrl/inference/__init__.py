"""Inference: batched sampling with KV cache, per-token logprobs and final-norm hidden-state capture."""

from __future__ import annotations

from swarmrl.utils.lazy import lazy_exports

_EXPORTS = {"SamplingParams": "swarmrl.inference.params", "SampleOutput": "swarmrl.inference.sampler",
            "generate": "swarmrl.inference.sampler"}
__all__ = list(_EXPORTS)

__getattr__ = lazy_exports(_EXPORTS)
