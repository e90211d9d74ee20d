"""Orchestrator state as SQLAlchemy 2 tables (SQLite by default, PostgreSQL by URL).

Everything the orchestrator knows lives here, so a restart loses nothing: nodes and their keys,
used nonces (until they expire), assignments, submissions, verdicts, the ledger and the current
step. Ledger rows are append-only: the ORM refuses updates and deletes of ``LedgerEntry``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    event,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Node(Base):
    __tablename__ = "nodes"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    public_key: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    # worker | validator | trainer | authority (deposits stake) | retired (key removed from config)
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)  # active | dead | ejected
    hardware: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    throughput: Mapped[float] = mapped_column(Float, default=0.0)  # measured tokens/s
    registered_at: Mapped[float] = mapped_column(Float, nullable=False)
    last_heartbeat: Mapped[float] = mapped_column(Float, nullable=False)
    status_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    __table_args__ = (Index("ix_nodes_status_hb", "status", "last_heartbeat"),)


class Nonce(Base):
    __tablename__ = "nonces"
    public_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    nonce: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_at: Mapped[float] = mapped_column(Float, nullable=False, index=True)


class Assignment(Base):
    __tablename__ = "assignments"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id"), nullable=False, index=True)
    origin_node_id: Mapped[str] = mapped_column(String(32), nullable=False)  # whose seed (differs when reassigned)
    step: Mapped[int] = mapped_column(BigInteger, nullable=False)
    seed: Mapped[int] = mapped_column(BigInteger, nullable=False)
    env: Mapped[str] = mapped_column(String(64), nullable=False)
    env_params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    n_tasks: Mapped[int] = mapped_column(Integer, nullable=False)
    group_size: Mapped[int] = mapped_column(Integer, nullable=False)
    policy_version: Mapped[int] = mapped_column(BigInteger, nullable=False)
    round: Mapped[int] = mapped_column(Integer, nullable=False, default=0)  # k-th own assignment of the node at this step
    target_length: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # open | submitted | orphaned (holder died, waiting for a taker) | reassigned (taken over; its holder may still
    # upload it first) | closed (another row of the same (origin, step, round) work was uploaded first)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    parent_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[float] = mapped_column(Float, nullable=False)
    __table_args__ = (UniqueConstraint("node_id", "origin_node_id", "step", "round", name="uq_assignment_node_step"),
                      Index("ix_assign_status_step", "status", "step"))


class Decline(Base):
    """A holder's refusal of an open assignment it cannot serve (``POST /v1/assignments/{id}/decline``): its row went
    back up for other nodes, and the work's family (``origin_node_id``, ``step``, ``round``) is never handed to
    ``node_id`` again. A table of its own, so an older database gains it at start-up (``create_all``)."""

    __tablename__ = "declines"
    assignment_id: Mapped[int] = mapped_column(ForeignKey("assignments.id"), primary_key=True, autoincrement=False)
    node_id: Mapped[str] = mapped_column(String(32), nullable=False)
    origin_node_id: Mapped[str] = mapped_column(String(32), nullable=False)
    step: Mapped[int] = mapped_column(BigInteger, nullable=False)
    round: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    reason: Mapped[str] = mapped_column(Text, nullable=False, default="")
    created_at: Mapped[float] = mapped_column(Float, nullable=False)
    __table_args__ = (Index("ix_declines_family", "node_id", "origin_node_id", "step", "round"),)


class Submission(Base):
    __tablename__ = "submissions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    assignment_id: Mapped[int] = mapped_column(ForeignKey("assignments.id"), nullable=False, unique=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id"), nullable=False, index=True)
    step: Mapped[int] = mapped_column(BigInteger, nullable=False, index=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    n_rows: Mapped[int] = mapped_column(Integer, nullable=False)
    informative: Mapped[int] = mapped_column(Integer, nullable=False, default=0)  # groups the trainer can use (claimed)
    status: Mapped[str] = mapped_column(String(16), nullable=False, index=True)  # pending | accepted | rejected
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    checks: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    validator_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    created_at: Mapped[float] = mapped_column(Float, nullable=False)
    validated_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class LedgerEntry(Base):
    """Append-only: balances are sums over rows; corrections are new rows referencing old ones."""

    __tablename__ = "ledger"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node_id: Mapped[str] = mapped_column(String(32), nullable=False, index=True)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)  # deposit | stake | credit | revoke | slash
    amount: Mapped[float] = mapped_column(Float, nullable=False)
    submission_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    ref_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)  # revoke -> credit row
    unlock_at: Mapped[float | None] = mapped_column(Float, nullable=True)  # credits: end of challenge window
    created_at: Mapped[float] = mapped_column(Float, nullable=False)
    note: Mapped[str | None] = mapped_column(Text, nullable=True)


class DilocoJudgement(Base):
    """A DiLoCo aggregator's judgement of one node's pseudo-gradient in one round (``POST
    /v1/validator/diloco/rounds``): one row per (run, round, node), so a retried report credits or slashes once."""

    __tablename__ = "diloco_judgements"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(64), nullable=False)
    round: Mapped[int] = mapped_column(BigInteger, nullable=False)
    node_id: Mapped[str] = mapped_column(String(32), nullable=False, index=True)
    validator_id: Mapped[str] = mapped_column(String(32), nullable=False)
    accepted: Mapped[bool] = mapped_column(Boolean, nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False, default="")
    credited: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    slashed: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    revoked: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    ejected: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    created_at: Mapped[float] = mapped_column(Float, nullable=False)
    __table_args__ = (UniqueConstraint("run_id", "round", "node_id", name="uq_diloco_judgement"),)


class TrainerMetric(Base):
    """The trainer's record of a policy version (loss, reward, held-out accuracy...), posted with its step
    (``POST /v1/trainer/step``): what the dashboard's curves show. Kept for the newest ``MAX_TRAINER_METRICS``
    versions."""

    __tablename__ = "trainer_metrics"
    version: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    record: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # TrainerPoint fields but version
    updated_at: Mapped[float] = mapped_column(Float, nullable=False)


class State(Base):
    __tablename__ = "state"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text, nullable=False)


@event.listens_for(LedgerEntry, "before_update")
def _no_update(mapper, connection, target) -> None:  # noqa: ANN001
    raise PermissionError("ledger entries are append-only")


@event.listens_for(LedgerEntry, "before_delete")
def _no_delete(mapper, connection, target) -> None:  # noqa: ANN001
    raise PermissionError("ledger entries are append-only")
