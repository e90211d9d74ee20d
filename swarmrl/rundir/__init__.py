"""The run directory: where everything of a run lives (``layout``), the trainer's typed records in it
(``records``), the committed policy versions (``policy_versions.PolicyDir``) and the writer the trainer, local
workers and the swarm's adapter keep it with (``writer.RunDir``: rollout bookkeeping, pruning, SHARDCAST
announcements). Standard library and pydantic only: the bottom layer every role and the dashboard read."""

from swarmrl.rundir.layout import RunLayout, announced_groups, rollout_file_name, step_of_dir
from swarmrl.rundir.records import EvalRecord, LossStats, StepRecord, TrainerLog, parse_trainer_row, read_trainer_log

__all__ = ["EvalRecord", "LossStats", "RunLayout", "StepRecord", "TrainerLog", "announced_groups",
           "parse_trainer_row", "read_trainer_log", "rollout_file_name", "step_of_dir"]
