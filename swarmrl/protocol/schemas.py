"""Request and response bodies of the orchestrator's HTTP API (they make its OpenAPI schema)."""

from __future__ import annotations

import base64
import json
import math
import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from swarmrl.contract import Budget, RLContract
from swarmrl.dashboard.schemas import TrainerPoint
from swarmrl.protocol.description import BaseModelRef
from swarmrl.utils.keys import public_key_problem


def nonfinite_path(value: Any) -> str | None:
    """Where a NaN or an infinity sits in a JSON-like value (``"a.b[2]"``, ``""`` for the value itself), or None."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:  # no recursion: nesting is bounded by the body size, not by Python's stack
        where, v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return where
        if isinstance(v, dict):
            stack.extend((f"{where}.{k}" if where else str(k), x) for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend((f"{where}[{i}]", x) for i, x in enumerate(v))
    return None


def _finite_json(v: dict[str, Any]) -> dict[str, Any]:
    where = nonfinite_path(v)
    if where is not None:
        raise ValueError(f"{where or 'value'} is not a finite number (NaN and Infinity are refused)")
    return v


# a free-form object from outside: any JSON, but no NaN or Infinity anywhere in it
FreeForm = Annotated[dict[str, Any], AfterValidator(_finite_json)]


class Body(BaseModel):
    # numbers from outside: NaN and +-Infinity are refused in every float field (free-form dicts: ``FreeForm``)
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# free-form dicts from nodes (hardware, status) are stored and served back: bounded after decoding
MAX_FREEFORM_KEYS = 32
MAX_FREEFORM_BYTES = 4096
MAX_INLINE_B64 = 64 << 20  # one inline file's base64 text (the orchestrator inlines far less: inline_file_bytes)


def bounded_dict(v: dict[str, Any]) -> dict[str, Any]:
    if len(v) > MAX_FREEFORM_KEYS:
        raise ValueError(f"at most {MAX_FREEFORM_KEYS} keys (got {len(v)})")
    size = len(json.dumps(v, separators=(",", ":"), default=str))
    if size > MAX_FREEFORM_BYTES:
        raise ValueError(f"at most {MAX_FREEFORM_BYTES} bytes as JSON (got {size})")
    return v


class RegisterRequest(Body):
    hardware: FreeForm = Field(default_factory=dict, description=f"free-form: gpu, memory, cpu... (at most "
                               f"{MAX_FREEFORM_KEYS} keys, {MAX_FREEFORM_BYTES} bytes as JSON)")
    throughput: float = Field(..., ge=0, le=1e9, description="measured generation throughput, tokens/s")
    stake: float = Field(..., ge=0, le=1e12, description="stake to lock in the ledger: at most what a stake "
                         "authority deposited for this key (unless the orchestrator runs self_declared_stake)")
    base_model: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="the BLAKE3 of the base model "
                                   "bundle this node serves (swarmrl.models.bundle); refused when it is not the run's")

    _hardware = field_validator("hardware")(bounded_dict)


class RegisterReply(Body):
    node_id: str
    heartbeat_interval_s: float
    stake_locked: float


class HeartbeatRequest(Body):
    status: FreeForm = Field(default_factory=dict, description=f"free-form worker status (at most "
                             f"{MAX_FREEFORM_KEYS} keys, {MAX_FREEFORM_BYTES} bytes as JSON)")

    _status = field_validator("status")(bounded_dict)


class TaskSpec(Body):
    task_id: str
    prompt: str


class AssignmentSpec(Body):
    assignment_id: int
    step: int
    policy_version: int
    seed: int
    # the run's shared rules, with this assignment's task: how to prompt (chat template, budget format), group size,
    # how a completion is scored, the proof geometry; the node samples under it and the validator re-checks by it
    contract: RLContract
    target_length: int | None  # the thinking budget's target (contract.budget), None: no budget
    tasks: list[TaskSpec]
    reassigned_from: str | None = None
    round: int = 0  # part of the seed derivation: blake2b(origin node | step | round | secret)

    def budget(self) -> Budget | None:
        """The thinking budget as node and validator both apply it (``swarmrl.contract.scoring``)."""
        return self.contract.budget.budget(self.target_length)


class HeartbeatReply(Body):
    node_id: str
    step: int
    policy_version: int
    heartbeat_interval_s: float
    weight_relays: list[str]  # SHARDCAST servers to fetch policy versions from (relays first)
    assignments: list[AssignmentSpec]
    weight_pubkey: str = ""  # Ed25519 public key (hex) that signs the SHARDCAST manifests ("" = unknown)
    # the orchestrator takes ``POST /v1/nodes/heartbeat?wait=S`` (an idle node's heartbeat answered when work may
    # have opened, or after S seconds), so a node without work may ask again at once instead of sleeping a heartbeat
    # interval; False from older orchestrators, and when a wait was answered at once for lack of waiting places
    long_poll: bool = False


class SubmitReply(Body):
    submission_id: int
    sha256: str
    n_rows: int
    status: str
    # upload with ?next=1: the heartbeat reply the node would get right after (its next work), saving a request
    next: HeartbeatReply | None = None


MAX_DECLINE_REASON = 500


class DeclineRequest(Body):
    """``POST /v1/assignments/{id}/decline``: the holder of an open assignment cannot serve it."""

    reason: str = Field("", max_length=MAX_DECLINE_REASON,
                        description="why the node cannot serve it (its policy version is unavailable, the task "
                        "environment cannot be built, ...)")


class DeclineReply(Body):
    assignment_id: int
    status: str  # the declined row's status now: "orphaned" (up for another node, same seed)


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


class InlineFile(Body):
    """A listed submission's file, base64 in the listing (``inline=N``); its sha256 is the submission's."""

    submission_id: int
    data: str = Field(max_length=MAX_INLINE_B64)

    def decoded(self, max_bytes: int) -> bytes:
        """The file's bytes; ``ValueError`` if not base64 or over ``max_bytes``."""
        if len(self.data) > 4 * (max_bytes // 3 + 1):
            raise ValueError(f"inline file of submission {self.submission_id} is over {max_bytes} bytes")
        data = base64.b64decode(self.data, validate=True)
        if len(data) > max_bytes:
            raise ValueError(f"inline file of submission {self.submission_id} is over {max_bytes} bytes")
        return data


class PendingList(Body):
    items: list[PendingSubmission]
    files: list[InlineFile] = Field(default_factory=list, max_length=256)  # with inline=N


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


MAX_DILOCO_NODES = 1024
_NODE_ID = r"^[0-9a-f]{32}$"


class DilocoRejection(Body):
    node_id: str = Field(..., pattern=_NODE_ID)
    reason: str = Field(..., min_length=1, max_length=1000)


class DilocoRoundRequest(Body):
    """``POST /v1/validator/diloco/rounds``: a DiLoCo aggregator's judgements of one round: credit the accepted
    nodes, slash and eject the rejected ones (once per run, round and node: a retried report changes nothing)."""

    run_id: str = Field(..., min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    round: int = Field(..., ge=0, le=2**62)
    accepted: list[str] = Field(default_factory=list, max_length=MAX_DILOCO_NODES)
    rejected: list[DilocoRejection] = Field(default_factory=list, max_length=MAX_DILOCO_NODES)

    @field_validator("accepted")
    @classmethod
    def _ids(cls, v: list[str]) -> list[str]:
        for nid in v:
            if not re.match(_NODE_ID, nid):
                raise ValueError(f"not a node id: {nid[:40]!r}")
        return v

    @model_validator(mode="after")
    def _once(self) -> DilocoRoundRequest:
        ids = self.accepted + [r.node_id for r in self.rejected]
        if len(set(ids)) != len(ids):
            raise ValueError("a node may be named once per round (accepted or rejected)")
        return self


class DilocoOutcome(Body):
    node_id: str
    accepted: bool
    credited: float = 0.0
    slashed: float = 0.0
    revoked: float = 0.0
    ejected: bool = False
    again: bool = False  # judged in an earlier report of this round: nothing changed now (the first's figures)


class DilocoRoundReply(Body):
    run_id: str
    round: int
    outcomes: list[DilocoOutcome]


MAX_STEP_METRICS = 64


class StepRequest(Body):
    step: int = Field(..., ge=0)
    policy_version: int = Field(..., ge=0)
    metrics: list[TrainerPoint] = Field(default_factory=list, max_length=MAX_STEP_METRICS,
                                        description="the trainer's records of recent policy versions (loss, reward, "
                                        "held-out accuracy), shown by the dashboard; sent again, a version's "
                                        "record is merged")


_URL = r"^https?://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~/\-]*)?$"


class WeightsRequest(Body):
    """Where nodes fetch policy versions: SHARDCAST servers and the key that signs their manifests."""

    servers: list[str] = Field(..., max_length=64)
    public_key: str = Field(..., pattern=r"^[0-9a-f]{64}$")
    base: BaseModelRef | None = None  # SHARDCAST version 0, the base model's bundle, once published

    @field_validator("servers")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        for u in v:
            if len(u) > 300 or not re.match(_URL, u):
                raise ValueError(f"not an http(s) server URL: {u[:80]!r}")
        return v

    @field_validator("public_key")
    @classmethod
    def _key(cls, v: str) -> str:
        why = public_key_problem(bytes.fromhex(v))
        if why is not None:
            raise ValueError(why)
        return v


class WeightsReply(Body):
    servers: list[str]
    public_key: str
    base: BaseModelRef | None = None


class StepReply(Body):
    step: int
    policy_version: int


class AcceptedList(Body):
    step: int
    optimistic: bool
    items: list[SubmissionInfo]
    changes: int = -1  # GET /v1/trainer/accepted: the counter (verdicts; optimistic: uploads) read before listing
    files: list[InlineFile] = Field(default_factory=list, max_length=256)  # with inline=N: the ones not in ``have``


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
    deposited: float = 0.0  # deposited by a stake authority and not locked as stake (yet)


class DepositRequest(Body):
    """A stake authority deposits stake for a node (by node id or public key; it need not be registered yet)."""

    node_id: str | None = Field(None, pattern=r"^[0-9a-f]{32}$")
    public_key: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    amount: float = Field(..., gt=0, le=1e12)
    note: str = Field("", max_length=500)

    @model_validator(mode="after")
    def _one_target(self) -> DepositRequest:
        if (self.node_id is None) == (self.public_key is None):
            raise ValueError("give exactly one of node_id and public_key")
        return self


class DepositReply(Body):
    node_id: str
    amount: float
    deposited: float  # the node's deposit not locked as stake, this one included
    entry_id: int


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
