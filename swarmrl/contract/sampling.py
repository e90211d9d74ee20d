"""The sampling settings (light: no torch import): part of the run's contract (``RLContract.sampling``), read by
every sampler's backend (``swarmrl.inference`` re-exports them as ``swarmrl.inference.params``), and the validator's
re-check of a row against them (``row_problem``).

The token limit has three meanings, each with one name and one default, declared here only (``TokenLimits``):

- ``max_new_tokens``: a single-turn task's completion, i.e. what one sampling call adds after its prompt (EOS
  included). The backends read this field and no other: inside an episode the episode runner sets it per call;
- ``max_trajectory_tokens``: a multi-turn episode's whole trajectory after the prompt, the model's turns and the
  environment's replies together (``swarmrl.episodes.turns``); by default ``max_new_tokens``;
- ``max_turn_tokens``: one model turn inside an episode (each call of ``episodes.turns``; each chat request of a
  verifiers episode, ``swarmrl.episodes.vf``); by default ``max_trajectory_tokens`` (a turn may fill the
  trajectory), never more.

A verifiers episode's length is bounded by its environment (its turns, its context); the trainer counts its rows,
like every episode's, against ``max_trajectory_tokens`` (``row_limit``).

The two later ones default to the one before because a single field used to serve all three: a config that sets
only ``max_new_tokens`` samples every kind of task as it did.

A node samples with its assignment's settings, whatever its own config says, and the validator holds each row to
them (``row_problem``): the contract's temperature (as the row stores it, float32) and no more model tokens than
the row's limit. Every value is bounded: the settings travel in every assignment.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import Field, model_validator

from swarmrl.config import StrictModel

if TYPE_CHECKING:
    from swarmrl.contract.rows import Rollout

__all__ = ["TokenLimits", "SamplingParams", "MAX_TOKENS", "MAX_TEMPERATURE", "as_stored", "row_problem"]

# bounds of every limit and temperature: the settings travel in the contract (in every assignment)
MAX_TOKENS = 1 << 20
MAX_TEMPERATURE = 100.0


class TokenLimits(StrictModel):
    """The token limits of sampling, one field per meaning (module docstring). The config sections that sample
    (``rl.contract.sampling``, ``rl.eval``, `swarmrl eval`, `swarmrl filter`) are this type plus their own fields, so
    the keys stay flat (``[rl.contract.sampling] max_trajectory_tokens = 80``)."""

    max_new_tokens: int = Field(8, ge=1, le=MAX_TOKENS)  # a single-turn completion (what one sampling call adds)
    # a multi-turn trajectory; None: max_new_tokens
    max_trajectory_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    # one model turn of an episode; None: max_trajectory_tokens
    max_turn_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _chain(self) -> TokenLimits:
        """A limit not set takes the one before it, again whenever that one is set (stored, so ``--print-config``
        and the role files a run derives show the value in force)."""
        given = self.model_fields_set
        if "max_trajectory_tokens" not in given or self.max_trajectory_tokens is None:
            self.__dict__["max_trajectory_tokens"] = self.max_new_tokens
        if "max_turn_tokens" not in given or self.max_turn_tokens is None:
            self.__dict__["max_turn_tokens"] = self.max_trajectory_tokens
        if self.max_turn_tokens > self.max_trajectory_tokens:  # type: ignore[operator]
            raise ValueError(f"max_turn_tokens ({self.max_turn_tokens}) is over max_trajectory_tokens "
                             f"({self.max_trajectory_tokens}): a model turn is part of its trajectory; set "
                             "max_trajectory_tokens to the whole episode's limit")
        return self

    def token_limits(self) -> TokenLimits:
        """The three limits alone (from a section that carries more fields)."""
        return TokenLimits(**{k: getattr(self, k) for k in TokenLimits.model_fields})

    def row_limit(self, multiturn: bool) -> int:
        """The most tokens a rollout row's completion may hold: a multi-turn task's row is its whole trajectory."""
        return self.max_trajectory_tokens if multiturn else self.max_new_tokens  # type: ignore[return-value]


class SamplingParams(TokenLimits):
    """One sampling call's settings: the token limits and how tokens are drawn. The run's (``rl.contract.sampling``)
    is part of its contract: every sampler uses the assignment's, and the validator holds each row to it."""

    temperature: float = Field(1.0, ge=0.0, le=MAX_TEMPERATURE, allow_inf_nan=False)  # 0 = greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)

    @classmethod
    def greedy(cls, limits: TokenLimits) -> SamplingParams:
        """Greedy decoding under ``limits`` (held-out evaluation)."""
        return cls(temperature=0.0, **limits.token_limits().model_dump())


def as_stored(temperature: float) -> float:
    """A temperature as a rollout row stores it (float32, ``swarmrl.rollouts.wire``)."""
    try:
        return struct.unpack("<f", struct.pack("<f", temperature))[0]
    except OverflowError:
        return math.copysign(math.inf, temperature)


def _shown(x: float) -> str:
    """A float32 value written short (0.7, not 0.699999988079071)."""
    v = as_stored(x)
    for digits in range(1, 10):
        s = float(f"{v:.{digits}g}")
        if as_stored(s) == v:
            return repr(s)
    return repr(v)


def row_problem(r: Rollout, s: SamplingParams, multiturn: Callable[[], bool], verifiers: bool = False) -> str | None:
    """Why row ``r`` was not sampled under ``s`` (None: it may have been): another temperature (compared as the row
    stores it), or more model-sampled tokens than its limit, ``s.row_limit``: a single-turn row ``max_new_tokens``,
    a multi-turn one ``max_trajectory_tokens``. ``multiturn()``: whether the task samples episodes (asked only when
    the row alone cannot tell: an episode's row whose tokens are all the model's is stored without a mask). A
    verifiers episode (``verifiers``) is bounded per model turn, not in total: its rows' length is not judged."""
    if not as_stored(r.temperature) == as_stored(s.temperature):  # also a NaN
        return f"sampled at temperature {_shown(r.temperature)}, the contract's is {_shown(s.temperature)}"
    n = len(r.model_positions())
    if r.completion_mask is None and n <= min(s.max_new_tokens, s.max_trajectory_tokens):  # type: ignore[type-var]
        return None  # within either limit: whatever the task's kind
    many = r.completion_mask is not None or multiturn()
    limit = s.row_limit(many)
    if n <= limit or (many and verifiers):
        return None
    return (f"{n} tokens sampled by the model, over the contract's "
            f"{'max_trajectory_tokens' if many else 'max_new_tokens'} = {limit}")
