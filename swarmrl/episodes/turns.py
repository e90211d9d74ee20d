"""Sampling multi-turn trajectories: the model's turns and a ``MultiTurnEnvironment``'s replies, as one token
sequence per completion (``swarmrl.envs.multiturn`` states the rules; the validator replays them).

Per turn, every still-active sequence is sampled with prompt = its prompt ids + its trajectory so far (the ids as
they are: nothing is re-tokenized). A new turn is cut at the token that completes the first stop string (the
tokens sampled after it are dropped: they do not affect the kept ones) and appended with mask 1 and its sampling
logprobs; the environment's reply is tokenized once (``encode_reply``) and appended with mask 0 and logprob 0. A
sequence ends at EOS, when the environment ends the episode (None), after ``max_turns`` model turns, or when the
trajectory's token limit (``max_trajectory_tokens``: the model's turns and the replies together) is spent; a
reply that would leave the model no token is not appended. Each model turn is also at most ``max_turn_tokens``
(``swarmrl.inference.params.TokenLimits``). The final-norm states of the model's tokens (captured while sampling each turn) are concatenated in
order, so TOPLOC proofs cover the model's tokens only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from swarmrl.envs.base import Task
from swarmrl.envs.multiturn import MultiTurnEnvironment, cut_at_stop
from swarmrl.inference.backend import InferenceBackend
from swarmrl.inference.params import SamplingParams
from swarmrl.inference.prompts import decode_completion, encode_reply


@dataclass
class Trajectory:
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    hidden: list[torch.Tensor] = field(default_factory=list)  # the model's tokens' states, turn by turn
    turns: list[str] = field(default_factory=list)  # the model's turns' texts
    finished: bool = False

    def add(self, ids: list[int], logprobs: list[float], model: bool) -> None:
        self.ids += ids
        self.logprobs += logprobs
        self.mask += [1 if model else 0] * len(ids)


@dataclass
class TurnOutput:
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    logprobs: list[list[float]]
    finished: list[bool]
    masks: list[list[int]]
    hidden: list[torch.Tensor] | None  # [model tokens, hidden] each


def sample_turns(backend: InferenceBackend, tokenizer, env: MultiTurnEnvironment, tasks: Sequence[Task],  # noqa: ANN001
                 prompts: Sequence[list[int]], params: SamplingParams, capture_hidden: bool = False) -> TurnOutput:
    """One trajectory per prompt (``tasks[i]``: the task of ``prompts[i]``; repeat both for a group)."""
    if len(tasks) != len(prompts):
        raise ValueError(f"{len(tasks)} tasks for {len(prompts)} prompts")
    limit = params.max_trajectory_tokens
    trajs = [Trajectory() for _ in prompts]
    active = list(range(len(prompts)))
    for _ in range(env.max_turns):
        if not active:
            break
        room = {i: min(limit - len(trajs[i].ids), params.max_turn_tokens) for i in active}
        p = params.model_copy(update={"max_new_tokens": max(room.values())})  # this call: one turn per sequence
        out = backend.generate([list(prompts[i]) + trajs[i].ids for i in active], p, capture_hidden=capture_hidden)
        nxt = []
        for k, i in enumerate(active):
            hidden = out.hidden[k] if out.hidden is not None else None
            if _model_turn(trajs[i], out.completion_ids[k], out.logprobs[k], hidden, room[i], tokenizer, env,
                           tasks[i], limit):
                nxt.append(i)
        active = nxt
    hidden = [torch.cat(t.hidden) if t.hidden else torch.empty(0) for t in trajs] if capture_hidden else None
    return TurnOutput([list(p) for p in prompts], [t.ids for t in trajs], [t.logprobs for t in trajs],
                      [t.finished for t in trajs], [t.mask for t in trajs], hidden)


def _model_turn(traj: Trajectory, ids: list[int], logprobs: list[float], hidden: torch.Tensor | None, room: int,
                tokenizer, env: MultiTurnEnvironment, task: Task, limit: int) -> bool:  # noqa: ANN001
    """Append one sampled turn (cut at its first stop string, at most ``room`` tokens) and the environment's
    reply to it; True when the trajectory goes on (``limit``: the trajectory's token limit)."""
    ids = list(ids[:room])
    cut = cut_at_stop(ids, lambda x: decode_completion(tokenizer, x), env.stop)
    keep = len(ids) if cut is None else cut
    traj.add(ids[:keep], list(logprobs[:keep]), model=True)
    if hidden is not None:
        traj.hidden.append(hidden[:keep])
    if cut is None:  # EOS, or the turn's or the trajectory's limit is spent
        traj.finished = bool(ids) and ids[-1] == tokenizer.eos_token_id
        return False
    traj.turns.append(decode_completion(tokenizer, ids[:keep]))
    if len(traj.turns) >= env.max_turns:
        return False
    reply = env.respond(task, list(traj.turns))
    if reply is None:
        return False
    reply_ids = encode_reply(tokenizer, reply)
    if not reply_ids or len(traj.ids) + len(reply_ids) >= limit:
        return False
    traj.add(reply_ids, [0.0] * len(reply_ids), model=False)
    return True
