"""The RL contract: the rules every role (worker, node, trainer, adapter, orchestrator, validator) shares.

Pure and torch-free. Each rule has one home here, and the roles call it instead of re-deriving it:

- ``window``: the staleness window (``async_level``): which policy versions may serve which steps.
- ``groups``: which groups of completions the trainer can use (complete, not all-tied). Advantages are not a
  shared rule: the trainer computes them from the rewards by its loss's rule (``swarmrl.rl.losses``).
- ``scoring``: how a completion is scored (task reward minus the thinking-budget length penalty),
  how a budget is stated in the prompt, and the validator's re-check of a claimed score.
- ``assignment``: seeded task assignment (protocol and local workers) and throughput-matched budgets.
- ``rows``: the rollout row and how sampler output (``Samples``) is packed into scored rows (logprobs, proofs)
  from one origin (``RowOrigin``: worker, step, policy version, seed, temperature).
- ``demand``: which step still needs work (local workers and the orchestrator).
- ``params``: ``RLContract``, every parameter the roles must agree on, as one typed object that every role's
  config and the wire schemas carry under the name ``contract``.
"""

from swarmrl.contract.assignment import (
    allowed_targets,
    assigned_tasks,
    draw_targets,
    task_seed,
    thinking_budget,
    worker_task_seed,
)
from swarmrl.contract.demand import Demand
from swarmrl.contract.groups import GroupRule, is_informative
from swarmrl.contract.params import PROOF_GEOMETRY, BudgetRule, ProofGeometry, RLContract
from swarmrl.contract.rows import Rollout, RowOrigin, Samples, ScoredBatch, score_groups
from swarmrl.contract.scoring import (
    Budget,
    Score,
    check_prompt_format,
    check_score,
    completion_length,
    format_prompt,
    length_penalty,
    score_completion,
)
from swarmrl.contract.window import AsyncWindow

__all__ = [
    "AsyncWindow", "Budget", "BudgetRule", "Demand", "GroupRule", "PROOF_GEOMETRY", "ProofGeometry", "RLContract",
    "Rollout", "RowOrigin", "Samples", "Score", "ScoredBatch", "allowed_targets", "assigned_tasks",
    "check_prompt_format", "check_score", "completion_length", "draw_targets", "format_prompt", "is_informative",
    "length_penalty", "score_completion", "score_groups", "task_seed", "thinking_budget", "worker_task_seed",
]
