"""Response models of the stats API (``GET /v1/stats/...``), shared by the orchestrator and by the small server
of ``swarmrl run --local`` (``swarmrl.dashboard.server``), so both answer the dashboard page alike. Every list
is capped (``MAX_NODES``, ``MAX_POINTS``): a swarm of 100k nodes or a run of 100k steps cannot make a big reply."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from swarmrl.rundir.records import EvalRecord, StepRecord, parse_trainer_row

MAX_NODES = 1000  # nodes listed by GET /v1/stats/nodes (the total is counted)
MAX_POINTS = 2000  # trainer points returned by GET /v1/stats/trainer (the newest ones)
MAX_VERSIONS = 64  # rows of the policy-version spread

_BIG = 1e15
Num = float | None


class StatsModel(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ValidationQueue(StatsModel):
    pending: int = Field(description="submissions waiting for the validator's verdict")
    oldest_pending_age_s: float | None = Field(None, description="how long the oldest pending one has waited")
    accepted: int
    rejected: int


class Overview(StatsModel):
    mode: Literal["swarm", "local"]
    time: float = Field(description="server time (unix s)")
    step: int = Field(description="the trainer's step (as announced to the orchestrator in swarm mode)")
    policy_version: int
    nodes: dict[str, int] = Field(description="worker nodes by status (active, dead, ejected; local: active, idle)")
    validation: ValidationQueue | None = Field(None, description="null where there is no validator (local mode)")
    counters: dict[str, int] = Field(default_factory=dict, description="this server process's request counters")


class NodeStats(StatsModel):
    node_id: str
    status: str
    throughput: float | None = Field(None, description="tokens/s: measured at registration (swarm), recent "
                                     "generation (local)")
    stake: float | None = Field(None, description="stake locked in the ledger, after slashes (null: local mode)")
    credits: float | None = Field(None, description="credits earned, net of revocations (null: local mode)")
    accepted: int | None = Field(None, description="submissions accepted (local: rollout batches written)")
    rejected: int | None = Field(None, description="submissions rejected by the validator (null: local mode)")
    pending: int | None = None
    slashes: int = 0
    slashed: float = 0.0
    last_seen: float | None = Field(None, description="last heartbeat (swarm) or metrics row (local), unix s")
    policy_version: int | None = Field(None, description="swarm: the version of its most recent assignment (what "
                                       "it was told to sample with); local: the version it generated with last")
    status_reason: str | None = None


class NodeList(StatsModel):
    total: int = Field(description="all worker nodes (the list holds at most `limit`)")
    limit: int
    items: list[NodeStats] = Field(description="active first, then by throughput")


class TrainerPoint(StatsModel):
    """One policy version's training record (the step that made it) and/or its held-out accuracy."""

    version: int = Field(ge=0, le=2**62, description="policy version (step n makes version n + 1; 0: base model)")
    step: int | None = Field(None, ge=0, le=2**62)
    time: float | None = Field(None, ge=0, le=_BIG)
    wall_s: Num = Field(None, ge=-_BIG, le=_BIG)
    loss: Num = Field(None, ge=-_BIG, le=_BIG)
    reward: Num = Field(None, ge=-_BIG, le=_BIG)
    task_reward: Num = Field(None, ge=-_BIG, le=_BIG)
    heldout_acc: Num = Field(None, ge=-_BIG, le=_BIG)
    lag_mean: Num = Field(None, ge=-_BIG, le=_BIG)


class TrainerCurves(StatsModel):
    total: int = Field(description="points known (the reply holds the newest `limit`)")
    source: str = Field(description="where the points come from")
    points: list[TrainerPoint]


class VersionCount(StatsModel):
    version: int
    nodes: int


class PolicyStats(StatsModel):
    policy_version: int
    step: int
    servers: list[str] = Field(description="SHARDCAST servers nodes fetch policies from (relays first)")
    public_key: str = Field("", description="key that signs the SHARDCAST manifests (\"\": unknown)")
    origin: str | None = Field(None, description="the trainer's SHARDCAST origin, where known")
    spread: list[VersionCount] = Field(description="nodes per policy version (newest first)")
    spread_basis: str = Field(description="what the spread counts")


_POINT_FIELDS = ("wall_s", "loss", "reward", "task_reward", "heldout_acc", "lag_mean")


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) and abs(v) <= _BIG else None


def point_from_row(row: dict[str, Any]) -> TrainerPoint | None:
    """The point of a trainer metrics row (``metrics/trainer.jsonl``, ``rundir.parse_trainer_row``): a step record
    or an ``eval``/``final`` evaluation; None for other rows. Non-finite numbers become null."""
    rec = parse_trainer_row(row)
    if isinstance(rec, StepRecord):
        step = rec.step
    elif isinstance(rec, EvalRecord):
        step = None
    else:
        return None
    if not 0 <= rec.version <= 2**62:
        return None
    fields = rec.model_dump()
    return TrainerPoint(version=rec.version, step=step, time=_num(rec.time),
                        **{k: _num(fields.get(k)) for k in _POINT_FIELDS})


def merge_points(points: list[TrainerPoint]) -> list[TrainerPoint]:
    """One point per version, in version order: later non-null fields win (a step row and the held-out
    evaluation of the same version become one point)."""
    out: dict[int, dict[str, Any]] = {}
    for p in points:
        d = out.setdefault(p.version, {"version": p.version})
        d.update({k: v for k, v in p.model_dump().items() if v is not None})
    return [TrainerPoint(**out[v]) for v in sorted(out)]
