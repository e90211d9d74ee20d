"""Settings of the SFT warm start (light)."""

from __future__ import annotations

from pydantic import Field

from swarmrl.config import StrictModel
from swarmrl.envs.config import TaskConfig
from swarmrl.models.config import ModelInitConfig


class SFTConfig(StrictModel):
    model: str | None = None  # a HF model dir; None = initialise a fresh tiny model
    init: ModelInitConfig = Field(default_factory=ModelInitConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    out: str = "runs/sft"
    minutes: float | None = Field(3.0, gt=0)  # wall-clock budget (None: use steps)
    steps: int | None = Field(None, ge=1)
    batch_size: int = Field(128, ge=1)
    lr: float = Field(2e-3, gt=0)
    warmup_steps: int = Field(20, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    eval_at_minutes: list[float] = Field(default_factory=lambda: [1.0, 2.0])
    # Stop early once held-out accuracy reaches this (checked every ``stop_check_every`` steps on a
    # held-out subset drawn with another seed than the evaluation set), e.g. to leave RL room.
    stop_at_accuracy: float | None = Field(None, gt=0, le=1)
    stop_check_every: int = Field(10, ge=1)
    stop_check_n: int = Field(256, ge=16)
    eval_n: int = Field(512, ge=1)
    threads: int | None = 2
    seed: int = 0
    chat_template: bool = False
