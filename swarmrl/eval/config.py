"""Settings of a held-out evaluation (light)."""

from __future__ import annotations

from pydantic import Field

from swarmrl.config import StrictModel
from swarmrl.envs.config import TaskConfig
from swarmrl.inference.config import InferenceConfig


class EvalConfig(StrictModel):
    model: str = "runs/sft/model"
    task: TaskConfig = Field(default_factory=TaskConfig)
    n: int = Field(512, ge=1)
    batch_size: int = Field(256, ge=1)
    max_new_tokens: int = Field(8, ge=1)
    chat_template: bool = False
    seed: int = 1234
    threads: int | None = None
    inference: InferenceConfig = Field(default_factory=InferenceConfig)  # the sampling backend
