"""``RLContract``: every parameter the roles of a run must agree on, as one typed object with its defaults.

A worker or node that samples, the trainer that trains, the orchestrator that hands out work and the validator
that re-checks it must read the same staleness window, group size, tie rule, task (with its prompt and answer
rules), chat-template flag, thinking-budget rule, sampling settings (temperature, top_p, token limits: every
sampler uses the assignment's, whatever its own config says, and the validator holds each row to them), TOPLOC
proof geometry and what a policy version is (``WeightsRule``: the inference weights' precision, whole or delta).
They do: the run config (``rl.contract``), the orchestrator's and validator's configs (``contract``) and the wire
schemas (``AssignmentSpec.contract``) all carry this one object under one name, and ``swarmrl run``
derives every role's copy from the run config's (``swarmrl.job.derive``). The rules that interpret it live beside it: ``window()``
(``AsyncWindow``), ``group_rule()`` (``GroupRule``), ``BudgetRule.budget`` (``Budget``).

It travels from the orchestrator to nodes and validators, so every field is bounded.
"""

from __future__ import annotations

import json

from pydantic import Field, field_validator

from swarmrl.config import StrictModel
from swarmrl.contract.groups import GroupRule
from swarmrl.contract.sampling import SamplingParams
from swarmrl.contract.scoring import Budget, check_prompt_format
from swarmrl.contract.weights import WeightsRule
from swarmrl.contract.window import AsyncWindow
from swarmrl.envs.config import TaskConfig

MAX_TASK_PARAMS_BYTES = 16 << 10  # a task's parameters as JSON (they ride in every assignment)


class BudgetRule(StrictModel):
    """The thinking budget: when ``enabled``, each group gets a target length from ``tiers``, stated in the prompt
    with ``prompt_format`` and scored ``reward = task_reward - penalty * |target - completion length|``. With
    ``match_throughput`` a worker only gets the tiers whose completions fit ``step_time_s`` at its measured speed
    (the orchestrator always matches a node's announced throughput)."""

    enabled: bool = False
    tiers: list[int] = Field(default_factory=lambda: [4, 8, 12], min_length=1, max_length=64)
    penalty: float = Field(0.02, ge=0, le=1e6, allow_inf_nan=False)
    prompt_format: str = Field("[{target}]{prompt}", max_length=1000)
    match_throughput: bool = False
    step_time_s: float = Field(10.0, gt=0, le=1e6, allow_inf_nan=False)

    @field_validator("tiers")
    @classmethod
    def _tiers(cls, v: list[int]) -> list[int]:
        if any(t <= 0 or t > 1 << 20 for t in v) or v != sorted(set(v)):
            raise ValueError("budget tiers must be positive (at most 2**20), distinct and ascending")
        return v

    @field_validator("prompt_format")
    @classmethod
    def _fmt(cls, v: str) -> str:
        return check_prompt_format(v)

    def budget(self, target: int | None) -> Budget | None:
        """The budget of one group with this target (None: no budget)."""
        return None if target is None else Budget(target, self.penalty, self.prompt_format)


class ProofGeometry(StrictModel):
    """TOPLOC proofs: one proof per ``chunk`` decode positions, committing the top ``k`` hidden values
    (``shared/specs/toploc-proof-format.md``: 32 and 128, 258 bytes per proof)."""

    chunk: int = Field(32, ge=1, le=1 << 16)
    k: int = Field(128, ge=1, le=1 << 12)


PROOF_GEOMETRY = ProofGeometry()


class RLContract(StrictModel):
    """The rules every role shares (module docstring)."""

    task: TaskConfig = Field(default_factory=TaskConfig)  # the task, its prompt format and answer rule
    chat_template: bool = False  # prompts stated in the tokenizer's chat template (samplers and validator alike)
    async_level: int = Field(2, ge=0, le=1 << 16)  # trainer step n trains on policy versions n - async_level .. n
    group_size: int = Field(8, ge=2, le=1 << 12)  # completions per task
    filter_ties: bool = True  # a group whose rewards all tie is not used (and does not count as work done)
    budget: BudgetRule = Field(default_factory=BudgetRule)
    # how every sampler samples (temperature, top_p, token limits; bounded: ``swarmrl.inference.params``); the
    # validator refuses a row at another temperature or over the limit (``protocol.checks.check_schema``)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    proof: ProofGeometry = Field(default_factory=ProofGeometry)
    # what a policy version is: the inference weights' precision, and whole versions or deltas (``contract.weights``)
    weights: WeightsRule = Field(default_factory=WeightsRule)

    @field_validator("task")
    @classmethod
    def _task(cls, v: TaskConfig) -> TaskConfig:
        if len(v.name) > 200:
            raise ValueError("task name longer than 200 characters")
        try:
            size = len(json.dumps(v.params, allow_nan=False))
        except (TypeError, ValueError) as e:
            raise ValueError(f"task params are not finite JSON: {e}") from None
        if size > MAX_TASK_PARAMS_BYTES:
            raise ValueError(f"task params are {size} bytes as JSON, over {MAX_TASK_PARAMS_BYTES}")
        return v

    def window(self, last_step: int = -1) -> AsyncWindow:
        return AsyncWindow(self.async_level, last_step=last_step)

    def group_rule(self) -> GroupRule:
        return GroupRule(self.group_size, self.filter_ties)
