"""The validator's replay of a multi-turn row: the environment runs here on the row's model turns."""

from __future__ import annotations

from typing import Any

from swarmrl.contract import Rollout
from swarmrl.envs import Task
from swarmrl.envs.multiturn import is_multiturn, replay_problem
from swarmrl.inference.prompts import decode_completion, encode_reply


def replay_check(env: Any, task: Task, r: Rollout, tokenizer: Any) -> str | None:
    """A multi-turn row's environment turns replayed (``swarmrl.envs.multiturn.replay_problem``: the environment
    runs here, deterministically, on the row's model turns); a single-turn task's row may hold no environment
    token. What is wrong, or None."""
    mask = r.model_mask()
    if not is_multiturn(env):
        return None if all(mask) else f"environment tokens (completion_mask 0) in a single-turn task ({task.env})"
    return replay_problem(env, task, list(r.completion_ids), mask, lambda ids: decode_completion(tokenizer, ids),
                          lambda text: encode_reply(tokenizer, text), getattr(tokenizer, "eos_token_id", None))
