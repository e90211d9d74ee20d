"""What the standalone commands take from a run config (``swarmrl eval|sft|filter -c configs/run.toml``): the
run's task and its params (the prompt and the answer rule among them), its chat template and answer length, so a
model is evaluated, warm-started or filtered on the very task the run trains on, before, during or after it,
without restating the task in --set options. The run uses the same settings for its own warm start and final
evaluation (``swarmrl.job.warmstart``, ``swarmrl.job.report``), so the commands and the run cannot drift apart.

Each function returns plain data in the command's config shape; ``--set`` and the command's options go over it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from swarmrl.job.config import RunConfig

__all__ = ["eval_settings", "filter_settings", "sft_settings"]


def eval_settings(run: RunConfig) -> dict[str, Any]:
    """``EvalConfig``: the run's final held-out evaluation, on the run's initial model (``--model`` picks another)."""
    rl = run.rl
    return {"model": rl.model, "task": rl.contract.task.model_dump(mode="json"), "n": run.final_eval_n,
            **rl.eval.token_limits().model_dump(), "chat_template": rl.contract.chat_template}


def sft_settings(run: RunConfig) -> dict[str, Any]:
    """``SFTConfig``: the run's warm start (``[warmstart.sft]``) on the run's task, prompted as RL will prompt it."""
    return {**run.warmstart.sft.model_dump(mode="json"), "task": run.rl.contract.task.model_dump(mode="json"),
            "chat_template": run.rl.contract.chat_template}


def filter_settings(run: RunConfig) -> dict[str, Any]:
    """``FilterConfig``: solve rates of the run's initial model on the run's task, sampled as its workers sample
    (``rl.contract.sampling``, one group of ``rl.contract.group_size`` completions per task)."""
    rl = run.rl
    return {"model": rl.model, "task": rl.contract.task.model_dump(mode="json"), "chat_template": rl.contract.chat_template,
            "sampling": rl.contract.sampling.model_dump(mode="json"), "samples": rl.contract.group_size}
