"""Sampling settings (light: no torch import)."""

from __future__ import annotations

from pydantic import Field

from swarmrl.config import StrictModel


class SamplingParams(StrictModel):
    max_new_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0.0)  # 0 = greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)
