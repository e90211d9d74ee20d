"""Sampling settings (light: no torch import).

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
"""

from __future__ import annotations

from pydantic import Field, model_validator

from swarmrl.config import StrictModel

__all__ = ["TokenLimits", "SamplingParams"]


class TokenLimits(StrictModel):
    """The token limits of sampling, one field per meaning (module docstring). The config sections that sample
    (``rl.sampling``, ``rl.eval``, `swarmrl eval`, `swarmrl filter`) are this type plus their own fields, so the
    keys stay flat (``[rl.sampling] max_trajectory_tokens = 80``)."""

    max_new_tokens: int = Field(8, ge=1)  # a single-turn completion (what one sampling call adds)
    max_trajectory_tokens: int | None = Field(None, ge=1)  # a multi-turn trajectory; None: max_new_tokens
    max_turn_tokens: int | None = Field(None, ge=1)  # one model turn of an episode; None: max_trajectory_tokens

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
    """One sampling call's settings: the token limits and how tokens are drawn."""

    temperature: float = Field(1.0, ge=0.0)  # 0 = greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)

    @classmethod
    def greedy(cls, limits: TokenLimits) -> SamplingParams:
        """Greedy decoding under ``limits`` (held-out evaluation)."""
        return cls(temperature=0.0, **limits.token_limits().model_dump())
