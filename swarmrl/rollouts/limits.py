"""What one rollout file may hold, decoded: ``RolloutLimits``, declared once.

Every reader of untrusted rollout files checks a file against these limits before it is materialised
(``swarmrl.rollouts.wire``): the orchestrator at upload, with the ``[rollout_limits]`` section of its config
(``OrchestratorConfig.rollout_limits``, these defaults unless the operator sets them), and the validator, the
adapter and the trainer with the defaults. So a file the orchestrator admits is never refused downstream for its
size. pydantic and ``swarmrl.config`` only: the orchestrator's config holds it without loading pyarrow.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field

from swarmrl.config import StrictModel

__all__ = ["RolloutLimits"]


class RolloutLimits(StrictModel):
    """The limits of one rollout file; a file over one is refused naming the field (``RolloutTooLarge.limit``).
    A file at ``max_decoded_bytes`` becomes about ten times that in Python objects once read. Frozen: one object
    is shared by every read."""

    model_config = ConfigDict(frozen=True)

    max_bytes: int = Field(64 << 20, gt=0)  # the file as stored or uploaded (compressed)
    max_rows: int = Field(65_536, gt=0)
    max_prompt_tokens: int = Field(32_768, gt=0)  # per row
    max_completion_tokens: int = Field(32_768, gt=0)  # per row
    max_proofs_per_row: int = Field(4_096, ge=0)
    max_proof_bytes: int = Field(4_096, ge=0)
    max_decoded_bytes: int = Field(64 << 20, gt=0)  # every column's values decoded (plain Arrow buffers)
    max_string_bytes: int = Field(1_024, gt=0)  # worker_id, task_id, env, group_id
    max_footer_bytes: int = Field(1 << 20, gt=0)  # the parquet footer (metadata), bounded before it is parsed
