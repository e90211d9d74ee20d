"""Environments: a seedable task source plus a verifier returning a reward in [0, 1].

Every environment splits its tasks into ``train`` and ``heldout`` by a hash of the task's
identity, so the split is a property of the task itself: training sampling can never draw a
held-out task, whatever seed it uses, and a validator can re-derive any assignment from a seed.
"""

from __future__ import annotations

import hashlib
import string
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal

Split = Literal["train", "heldout"]


@dataclass(frozen=True)
class Task:
    """One verifiable task. ``verification_info`` is JSON-serialisable and is all a verifier needs."""

    task_id: str
    env: str
    prompt: str
    verification_info: dict[str, Any]
    task_type: str
    demonstration: str | None = None  # a correct completion, for the SFT warm start
    meta: dict[str, Any] = field(default_factory=dict)


def heldout_bucket(key: str, heldout_pct: float) -> bool:
    """True when ``key`` falls in the held-out share (stable across runs and machines)."""
    h = int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")
    return (h % 10_000) < int(round(heldout_pct * 100))


MAX_PROMPT_CHARS = 1_000  # a task's prompt format (a config value, from whoever wrote the run config)


def check_prompt_format(prompt: str, field: str) -> None:
    """A prompt format names ``{field}`` and nothing else (no attribute access, no other fields); ValueError
    otherwise, saying why."""
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ValueError(f"prompt is {len(prompt)} characters, over {MAX_PROMPT_CHARS}")
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(prompt) if f is not None]
    except ValueError as e:
        raise ValueError(f"prompt {prompt!r} is not a valid format: {e}") from None
    if fields != [field]:
        raise ValueError(f"prompt must contain {{{field}}} exactly once and no other field, not {prompt!r}")


class VerifierUnavailable(RuntimeError):
    """The verifier could not judge a completion because its own machinery failed (a sandbox that did not
    start, a broken report): that says nothing about the completion. Raised only by environments whose
    ``strict`` is set (the validator: its own failure must not read as a wrong answer and slash the node);
    otherwise ``verify`` gives 0 and never raises."""


class Environment(ABC):
    """A task source and its verifier."""

    name: str = "env"
    strict: bool = False  # verify raises VerifierUnavailable instead of giving 0 when it cannot judge

    @abstractmethod
    def sample(self, seed: int, n: int, split: Split = "train") -> list[Task]:
        """``n`` tasks drawn deterministically from ``seed``, all in ``split``."""

    @abstractmethod
    def verify(self, task: Task, completion: str) -> float:
        """Reward in [0, 1] for ``completion`` (the generated text, without the prompt)."""

    def heldout_set(self, n: int, seed: int = 1234) -> list[Task]:
        """A fixed held-out evaluation set."""
        return self.sample(seed, n, split="heldout")
