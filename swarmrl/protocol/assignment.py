"""Seeded task assignment and thinking budgets (pure: validators re-derive the same tasks).

A node's tasks for a step come from ``seed = blake2b(node_id | step | run_secret)``; neither the
node nor the orchestrator operator picks them, and anyone holding the run secret can check that a
submission answers exactly the tasks its seed yields.
"""

from __future__ import annotations

import hashlib
from typing import Any

from swarmrl.envs import Task, make_env


def task_seed(node_id: str, step: int, run_secret: str, round: int = 0) -> int:
    """A 63-bit seed (fits a signed int64 column). ``round`` numbers a node's own assignments at one step
    (demand-driven assignment hands out several); round 0 keeps the original derivation."""
    msg = f"{node_id}|{step}|{run_secret}" if round == 0 else f"{node_id}|{step}|{round}|{run_secret}"
    h = hashlib.blake2b(msg.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(h, "big") >> 1


def assigned_tasks(env: str, env_params: dict[str, Any], seed: int, n: int) -> list[Task]:
    return make_env(env, **(env_params or {})).sample(seed, n)


def thinking_budget(throughput: float, tiers: list[int], n_tasks: int, group_size: int,
                    target_step_time_s: float) -> int | None:
    """The largest budget tier whose worst-case token count fits the target step time at this node's
    throughput (tokens/s); slow nodes get the smallest tier, no tiers means no budget."""
    if not tiers:
        return None
    capacity = throughput * target_step_time_s
    best = tiers[0]
    for t in tiers:
        if t * n_tasks * group_size <= capacity:
            best = t
    return best
