"""Request and response bodies of the orchestrator's HTTP API (they make its OpenAPI schema)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RegisterRequest(Body):
    hardware: dict[str, Any] = Field(default_factory=dict, description="free-form: gpu, memory, cpu...")
    throughput: float = Field(..., ge=0, le=1e9, description="measured generation throughput, tokens/s")
    stake: float = Field(..., ge=0, le=1e12, description="stake to lock in the ledger")


class RegisterReply(Body):
    node_id: str
    heartbeat_interval_s: float
    stake_locked: float


class HeartbeatRequest(Body):
    status: dict[str, Any] = Field(default_factory=dict, description="free-form worker status")


class TaskSpec(Body):
    task_id: str
    prompt: str


class AssignmentSpec(Body):
    assignment_id: int
    step: int
    policy_version: int
    seed: int
    env: str
    env_params: dict[str, Any]
    group_size: int
    target_length: int | None
    tasks: list[TaskSpec]
    reassigned_from: str | None = None
    round: int = 0  # part of the seed derivation: blake2b(origin node | step | round | secret)
    # with a thinking budget (target_length): the prompt is budget_prompt_format.format(target=, prompt=) and
    # reward = task_reward - budget_penalty * |target_length - completion tokens before EOS|
    budget_prompt_format: str = Field("", max_length=1000)
    budget_penalty: float = Field(0.0, ge=0, le=1e6)

    @field_validator("budget_prompt_format")
    @classmethod
    def _fmt(cls, v: str) -> str:  # a node formats prompts with it: only {prompt} and {target}, no attribute access
        from swarmrl.rl.budget import check_prompt_format

        return check_prompt_format(v) if v else v


class HeartbeatReply(Body):
    node_id: str
    step: int
    policy_version: int
    async_window: int
    heartbeat_interval_s: float
    weight_relays: list[str]  # SHARDCAST servers to fetch policy versions from (relays first)
    assignments: list[AssignmentSpec]
    weight_pubkey: str = ""  # Ed25519 public key (hex) that signs the SHARDCAST manifests ("" = unknown)


class SubmitReply(Body):
    submission_id: int
    sha256: str
    n_rows: int
    status: str


class CheckResult(Body):
    name: str
    ok: bool
    reason: str = ""
    skipped: bool = False


class SubmissionInfo(Body):
    submission_id: int
    node_id: str
    assignment_id: int
    step: int
    sha256: str
    size: int
    n_rows: int
    status: str
    reason: str | None = None
    created_at: float
    informative: int = 0  # usable groups in the file (as claimed at upload; trusted once accepted)


class SubmissionDetail(SubmissionInfo):
    checks: list[CheckResult] = Field(default_factory=list)
    validator_id: str | None = None
    validated_at: float | None = None


class PendingSubmission(Body):
    submission: SubmissionInfo
    assignment: AssignmentSpec
    origin_node_id: str
    current_step: int
    current_policy_version: int
    async_window: int


class PendingList(Body):
    items: list[PendingSubmission]


class VerdictRequest(Body):
    submission_id: int
    accepted: bool
    reason: str = Field("", max_length=4000)
    checks: list[CheckResult] = Field(default_factory=list, max_length=64)


class VerdictReply(Body):
    submission_id: int
    status: str
    credited: float = 0.0
    slashed: float = 0.0
    revoked: float = 0.0
    ejected: bool = False


class StepRequest(Body):
    step: int = Field(..., ge=0)
    policy_version: int = Field(..., ge=0)


_URL = r"^https?://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~/\-]*)?$"


class WeightsRequest(Body):
    """Where nodes fetch policy versions: SHARDCAST servers and the key that signs their manifests."""

    servers: list[str] = Field(..., max_length=64)
    public_key: str = Field(..., pattern=r"^[0-9a-f]{64}$")

    @field_validator("servers")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        import re

        for u in v:
            if len(u) > 300 or not re.match(_URL, u):
                raise ValueError(f"not an http(s) server URL: {u[:80]!r}")
        return v


class WeightsReply(Body):
    servers: list[str]
    public_key: str


class StepReply(Body):
    step: int
    policy_version: int


class AcceptedList(Body):
    step: int
    optimistic: bool
    items: list[SubmissionInfo]


class LedgerRow(Body):
    id: int
    kind: str
    amount: float
    submission_id: int | None
    ref_id: int | None
    unlock_at: float | None
    created_at: float
    note: str | None


class Balance(Body):
    node_id: str
    status: str
    stake: float
    credits_locked: float
    credits_unlocked: float
    entries: list[LedgerRow]


class NodeInfo(Body):
    node_id: str
    role: str
    status: str
    throughput: float
    last_heartbeat: float
    status_reason: str | None


class Health(Body):
    ok: bool
    step: int
    policy_version: int
    nodes_active: int


class ErrorBody(Body):
    detail: str
