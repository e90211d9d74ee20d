"""Inference: batched sampling with KV cache, per-token logprobs and final-norm hidden-state capture, behind a
backend interface (``backend``: ``ours``, or vLLM in its own environment; docs/inference.md)."""

from __future__ import annotations

from swarmrl.utils.lazy import lazy_exports

_EXPORTS = {"SamplingParams": "swarmrl.inference.params", "SampleOutput": "swarmrl.inference.sampler",
            "generate": "swarmrl.inference.sampler", "InferenceConfig": "swarmrl.inference.config",
            "InferenceBackend": "swarmrl.inference.backend", "OursBackend": "swarmrl.inference.backend",
            "make_backend": "swarmrl.inference.backend"}
__all__ = list(_EXPORTS)

__getattr__ = lazy_exports(_EXPORTS)
