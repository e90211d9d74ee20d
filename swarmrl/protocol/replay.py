"""The validator's replay of a multi-turn row: the environment runs here on the row's model turns."""

from __future__ import annotations

from typing import Any

from swarmrl.contract import Rollout
from swarmrl.envs import Task
from swarmrl.envs.multiturn import is_multiturn, replay_problem
from swarmrl.envs.vf import TASK_TYPE as VF_TASK_TYPE
from swarmrl.envs.vf import is_verifiers_env
from swarmrl.inference.chat_tokens import chat_prompt_ids
from swarmrl.inference.prompts import decode_completion, encode_prompt, encode_reply


def replay_check(env: Any, task: Task, r: Rollout, tokenizer: Any) -> str | None:
    """A multi-turn row's environment turns replayed (``swarmrl.envs.multiturn.replay_problem``: the environment
    runs here, deterministically, on the row's model turns); a single-turn task's row may hold no environment
    token. What is wrong, or None."""
    mask = r.model_mask()
    if not is_multiturn(env):
        return None if all(mask) else f"environment tokens (completion_mask 0) in a single-turn task ({task.env})"
    return replay_problem(env, task, list(r.completion_ids), mask, lambda ids: decode_completion(tokenizer, ids),
                          lambda text: encode_reply(tokenizer, text), getattr(tokenizer, "eos_token_id", None))


def replay_and_text(env: Any, task: Task, r: Rollout, tokenizer: Any) -> tuple[str | None, str]:
    """The replay's finding (None: the row replays) and the text the verifier scores: the decoded completion, or
    for a verifiers episode (``vf:``) the conversation its replay rebuilt (``swarmrl.episodes.vf``)."""
    if is_verifiers_env(env):
        from swarmrl.episodes.vf import replay_row  # noqa: PLC0415  # lazy: the optional verifiers extra

        return replay_row(env, task, list(r.prompt_ids), list(r.completion_ids), r.model_mask(), tokenizer)
    return replay_check(env, task, r, tokenizer), decode_completion(tokenizer, list(r.completion_ids))


def task_prompt_ids(task: Task, tokenizer: Any, text: str, chat_template: bool) -> list[int]:
    """The prompt ids a row of ``task`` must carry: ``text`` encoded, or for a verifiers task its chat messages
    rendered with the tokenizer's template (``swarmrl.inference.chat_tokens``)."""
    if task.task_type == VF_TASK_TYPE:
        return chat_prompt_ids(tokenizer, task.meta["messages"], task.meta.get("tools"))
    return encode_prompt(tokenizer, text, chat_template)
