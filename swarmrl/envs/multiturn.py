"""Multi-turn environments: the model writes a turn, the environment answers, the model goes on.

A trajectory is one token sequence after the prompt: the model's turns (sampled; mask 1) and the environment's
replies (each reply's text tokenized once, without special tokens; mask 0), in order. A model turn ends at the
first of the environment's ``stop`` strings (cut at the token that completes it: the tokens sampled after it are
dropped), at EOS (the episode is over), or when the token budget runs out. After a turn cut at a stop string the
environment answers with ``respond(task, turn_texts)`` (deterministic: a function of the task and the model's
turns so far; None ends the episode), unless ``max_turns`` model turns were taken.

``replay_problem`` is the rule both sides apply: the sampler builds trajectories that satisfy it, and the
validator re-runs it on a row (split by its mask) and rejects a trajectory whose environment turns do not
replay. Nothing here imports a tokenizer: ``decode`` and ``encode`` are passed in.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import NamedTuple

from swarmrl.envs.base import Environment, Task

Decode = Callable[[list[int]], str]
Encode = Callable[[str], list[int]]


class MultiTurnEnvironment(Environment):
    """An environment the model talks to: ``respond`` answers a model turn that ended at one of ``stop``."""

    max_turns: int = 4  # model turns per episode
    stop: tuple[str, ...] = ()  # strings that end a model turn (the environment answers after them)

    @abstractmethod
    def respond(self, task: Task, turns: Sequence[str]) -> str | None:
        """The environment's reply to the model's latest turn (``turns``: every model turn's text so far, the
        latest last, each ending at a stop string); None: the episode is over. Deterministic."""


def is_multiturn(env: object) -> bool:
    return isinstance(env, MultiTurnEnvironment)


def cut_at_stop(ids: Sequence[int], decode: Decode, stops: Sequence[str]) -> int | None:
    """The length of the shortest prefix of ``ids`` whose text holds a stop string (None: no stop string in the
    text of ``ids``). One decode when there is none; otherwise a bisection over prefix lengths, about log2(n)
    decodes (a row near the token budget must not cost one decode per prefix: that was quadratic). A prefix's text
    holding a stop string is taken to hold it in every longer prefix, as a tokenizer's decode does (the text only
    grows at its end); the node's sampler and the validator's replay share this function, so they cut alike."""
    ids = list(ids)

    def holds(k: int) -> bool:
        text = decode(ids[:k])
        return any(s in text for s in stops)

    if not stops or not holds(len(ids)):
        return None
    lo, hi = 0, len(ids)  # the prefix of length hi holds a stop string; none of length <= lo is known to
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid
    return hi


class Segment(NamedTuple):
    start: int
    end: int
    model: bool  # sampled by the model (mask 1) or the environment's reply (mask 0)


def segments(mask: Sequence[int]) -> list[Segment]:
    """Maximal runs of equal mask values, in order."""
    out: list[Segment] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or bool(mask[i]) != bool(mask[start]):
            out.append(Segment(start, i, bool(mask[start])))
            start = i
    return out


def replay_problem(env: MultiTurnEnvironment, task: Task, ids: Sequence[int], mask: Sequence[int],
                   decode: Decode, encode: Encode, eos_id: int | None) -> str | None:
    """What is wrong with a trajectory (None: it replays): it starts and ends with a model turn; every model turn
    but the last ends exactly where its first stop string completes and holds no EOS; the last goes on past no
    stop string; every environment turn is ``encode(env.respond(task, turns so far))``; at most ``max_turns``
    model turns."""
    if len(ids) != len(mask):
        return f"{len(mask)} mask values for {len(ids)} tokens"
    segs = segments(mask)
    if not segs or not segs[0].model:
        return "the trajectory does not start with a model turn"
    if not segs[-1].model:
        return "the trajectory ends with an environment turn"
    model = segs[0::2]
    if len(model) > env.max_turns:
        return f"{len(model)} model turns, over the environment's {env.max_turns}"
    turns: list[str] = []
    for k, seg in enumerate(model):
        part = list(ids[seg.start: seg.end])
        cut = cut_at_stop(part, decode, env.stop)
        last = k == len(model) - 1
        if not last and eos_id is not None and eos_id in part:
            return f"model turn {k} holds EOS and an environment turn follows"
        if not last and cut != len(part):
            return f"model turn {k} does not end where a stop string {list(env.stop)} completes"
        if last and cut is not None and cut != len(part):
            return f"model turn {k} goes on past a stop string"
        turns.append(decode(part))
        if last:
            break
        reply = env.respond(task, list(turns))
        if reply is None:
            return f"environment turn {k}: the environment ends the episode there"
        want = encode(reply)
        got = list(ids[segs[2 * k + 1].start: segs[2 * k + 1].end])
        if got != want:
            return f"environment turn {k} is not the environment's reply"
    return None
