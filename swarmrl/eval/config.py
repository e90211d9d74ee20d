"""Settings of a held-out evaluation (light)."""

from __future__ import annotations

from pydantic import Field

from swarmrl.envs.config import TaskConfig
from swarmrl.inference.config import InferenceConfig
from swarmrl.inference.params import TokenLimits


class EvalConfig(TokenLimits):
    """`swarmrl eval`: greedy held-out accuracy under the token limits (``TokenLimits``: a single-turn completion's
    ``max_new_tokens``, a multi-turn trajectory's ``max_trajectory_tokens``)."""

    model: str = "runs/sft/model"
    task: TaskConfig = Field(default_factory=TaskConfig)
    n: int = Field(512, ge=1)
    batch_size: int = Field(256, ge=1)
    chat_template: bool = False
    seed: int = 1234
    threads: int | None = None
    inference: InferenceConfig = Field(default_factory=InferenceConfig)  # the sampling backend
