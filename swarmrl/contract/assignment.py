"""Seeded task assignment and throughput-matched thinking budgets.

In the swarm a node's tasks for a step come from ``seed = blake2b(node_id | step | run_secret)``: neither the
node nor the orchestrator operator picks them, and anyone holding the run secret re-derives them to check
that a submission answers exactly the tasks its seed yields. Trusted local workers draw their own seeds
(``worker_task_seed``).
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Protocol

from swarmrl.envs import Task, make_env


def _seed63(msg: str) -> int:
    """A 63-bit seed (fits a signed int64 column)."""
    return int.from_bytes(hashlib.blake2b(msg.encode("utf-8"), digest_size=8).digest(), "big") >> 1


def task_seed(node_id: str, step: int, run_secret: str, round: int = 0) -> int:
    """The seed of a node's assignment. ``round`` numbers a node's own assignments at one step (demand-driven
    assignment hands out several); round 0 keeps the original derivation."""
    return _seed63(f"{node_id}|{step}|{run_secret}" if round == 0 else f"{node_id}|{step}|{round}|{run_secret}")


def worker_task_seed(worker_id: str, step: int, counter: int, run_seed: int) -> int:
    """A trusted local worker's seed for its ``counter``-th batch."""
    return _seed63(f"{run_seed}|{worker_id}|{step}|{counter}")


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


class _BudgetSettings(Protocol):  # ``params.BudgetRule``
    tiers: list[int]
    match_throughput: bool
    step_time_s: float


def allowed_targets(cfg: _BudgetSettings, tokens_per_s: float | None, sequences_per_batch: int) -> list[int]:
    """Targets a local worker of the given throughput may get (always at least the shortest one)."""
    targets = sorted(set(cfg.tiers))
    if not targets:
        raise ValueError("budget.tiers is empty")
    if not cfg.match_throughput or not tokens_per_s:
        return targets
    cap = tokens_per_s * cfg.step_time_s / max(1, sequences_per_batch)
    fit = [t for t in targets if t <= cap]
    return fit or targets[:1]


def draw_targets(n: int, targets: list[int], rng: random.Random) -> list[int]:
    return [rng.choice(targets) for _ in range(n)]
