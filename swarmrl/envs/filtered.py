"""A task source restricted to a list of tasks kept by offline filtering (``swarmrl filter``).

The list is a JSONL file of tasks of one base environment (written by ``swarmrl.filtering.offline``).
Training samples only those tasks; verification and the held-out set stay the base
environment's, so held-out accuracy remains comparable with unfiltered runs.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from swarmrl.envs.base import Environment, Split, Task
from swarmrl.envs.datafile import DataFileError
from swarmrl.envs.registry import make_env, register_env


class FilteredEnv(Environment):
    def __init__(self, path: str, base: str, base_params: dict[str, Any] | None = None) -> None:
        self.base = make_env(base, **(base_params or {}))
        self.name = self.base.name
        self.path = Path(path)
        self.tasks = self._load()
        if not self.tasks:
            raise DataFileError(f"{self.path}: no tasks (the filter band kept nothing?)")

    def _load(self) -> list[Task]:
        if not self.path.is_file():
            raise DataFileError(f"{self.path}: task list not found")
        out = []
        for i, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                t = Task(task_id=str(d["task_id"]), env=str(d["env"]), prompt=str(d["prompt"]),
                         verification_info=dict(d["verification_info"]), task_type=str(d["task_type"]),
                         demonstration=d.get("demonstration"))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise DataFileError(f"{self.path}:{i}: not a task record ({e})") from None
            if t.env != self.base.name:
                raise DataFileError(f"{self.path}:{i}: task of env {t.env!r}, expected {self.base.name!r}")
            out.append(t)
        return out

    def sample(self, seed: int, n: int, split: Split = "train") -> list[Task]:
        if split == "heldout":
            return self.base.sample(seed, n, split)
        rng = random.Random(f"filtered:{seed}")
        return [rng.choice(self.tasks) for _ in range(n)]

    def heldout_set(self, n: int, seed: int = 1234) -> list[Task]:
        return self.base.heldout_set(n, seed)

    def verify(self, task: Task, completion: str) -> float:
        return self.base.verify(task, completion)


@register_env("filtered")
def _filtered(path: str, base: str, base_params: dict[str, Any] | None = None) -> FilteredEnv:
    return FilteredEnv(path, base, base_params)
