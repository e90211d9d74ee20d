"""Config section that names a task and its knobs."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from swarmrl.config import StrictModel
from swarmrl.envs import Environment, make_env


class TaskConfig(StrictModel):
    name: str = "mul_add"
    params: dict[str, Any] = Field(default_factory=dict)

    def build(self) -> Environment:
        return make_env(self.name, **self.params)
