"""The dashboard's stats (``GET /v1/stats/...``, models in ``swarmrl.dashboard.models``): nodes with their stake,
credits, verdicts and slashes, the trainer's curves (posted with its step), the policy version and its spread,
the validation queue. Every answer is bounded (at most ``MAX_NODES`` nodes, ``MAX_POINTS`` points; per-node
figures are queried for the listed nodes only) and reused for ``STATS_CACHE_S``, so polling dashboards cost the
database a few grouped queries a second however many there are."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import case, delete, func, select
from sqlalchemy.orm import Session

from swarmrl.dashboard.models import (
    MAX_NODES,
    MAX_POINTS,
    MAX_VERSIONS,
    NodeList,
    NodeStats,
    Overview,
    PolicyStats,
    TrainerCurves,
    TrainerPoint,
    ValidationQueue,
    VersionCount,
)
from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.db import Database
from swarmrl.protocol.models import Assignment, LedgerEntry, Node, Submission, TrainerMetric

STATS_CACHE_S = 1.0
MAX_TRAINER_METRICS = 10_000  # versions kept in trainer_metrics
SPREAD_ASSIGNMENTS = 20_000  # the policy-version spread looks at this many newest assignments


class StatsMixin:
    """Dashboard stats, part of ``Orchestrator`` (state set up by its ``__init__``)."""

    cfg: OrchestratorConfig
    db: Database
    counters: dict[str, int]
    _stats_cache: dict[tuple, tuple[float, Any]]
    _state: Callable[[Any], tuple[int, int]]
    _weights: tuple[list[str], str]

    def _cached(self, key: tuple, make: Callable[[], Any]) -> Any:
        now = time.monotonic()
        hit = self._stats_cache.get(key)
        if hit is not None and now - hit[0] < STATS_CACHE_S:
            return hit[1]
        value = make()
        self._stats_cache[key] = (now, value)
        return value

    # ---- trainer metrics (written by set_step) ----------------------------------------------------
    @staticmethod
    def store_trainer_metrics(s: Session, points: list[TrainerPoint], now: float | None = None) -> None:
        """Merge the trainer's records into ``trainer_metrics`` (one row per version) and drop the oldest
        beyond ``MAX_TRAINER_METRICS`` versions."""
        now = time.time() if now is None else now
        for p in points:
            values = p.model_dump(exclude_none=True, exclude={"version"})
            row = s.get(TrainerMetric, p.version)
            if row is None:
                s.add(TrainerMetric(version=p.version, record=values, updated_at=now))
            else:
                row.record = {**row.record, **values}
                row.updated_at = now
        s.flush()
        newest = max(p.version for p in points)
        s.execute(delete(TrainerMetric).where(TrainerMetric.version <= newest - MAX_TRAINER_METRICS))

    # ---- views -------------------------------------------------------------------------------------
    def stats_overview(self) -> Overview:
        return self._cached(("overview",), self._overview)

    def _overview(self) -> Overview:
        with self.db.tx() as s:
            step, pv = self._state(s)
            nodes = dict(s.execute(select(Node.status, func.count()).where(Node.role == "worker")
                                   .group_by(Node.status)).all())
            subs = dict(s.execute(select(Submission.status, func.count()).group_by(Submission.status)).all())
            oldest = s.execute(select(func.min(Submission.created_at))
                               .where(Submission.status == "pending")).scalar_one()
        now = time.time()
        q = ValidationQueue(pending=int(subs.get("pending", 0)), accepted=int(subs.get("accepted", 0)),
                            rejected=int(subs.get("rejected", 0)),
                            oldest_pending_age_s=None if oldest is None else round(max(0.0, now - oldest), 3))
        return Overview(mode="swarm", time=now, step=step, policy_version=pv,
                        nodes={k: int(v) for k, v in nodes.items()}, validation=q, counters=dict(self.counters))

    def stats_nodes(self, limit: int = MAX_NODES) -> NodeList:
        return self._cached(("nodes", limit), lambda: self._nodes(min(limit, MAX_NODES)))

    def _nodes(self, limit: int) -> NodeList:
        with self.db.tx() as s:
            total = s.execute(select(func.count()).select_from(Node).where(Node.role == "worker")).scalar_one()
            rows = s.execute(select(Node.id, Node.status, Node.throughput, Node.last_heartbeat, Node.status_reason)
                             .where(Node.role == "worker")
                             .order_by(case((Node.status == "active", 0), else_=1), Node.throughput.desc(), Node.id)
                             .limit(limit)).all()
            ids = [r.id for r in rows]
            ledger: dict[str, dict[str, tuple[float, int]]] = {}
            subs: dict[str, dict[str, int]] = {}
            versions: dict[str, int] = {}
            if ids:
                for nid, kind, total_amount, n in s.execute(
                        select(LedgerEntry.node_id, LedgerEntry.kind, func.sum(LedgerEntry.amount), func.count())
                        .where(LedgerEntry.node_id.in_(ids),
                               LedgerEntry.kind.in_(("stake", "slash", "credit", "revoke")))
                        .group_by(LedgerEntry.node_id, LedgerEntry.kind)):
                    ledger.setdefault(nid, {})[kind] = (float(total_amount or 0.0), int(n))
                for nid, status, n in s.execute(
                        select(Submission.node_id, Submission.status, func.count())
                        .where(Submission.node_id.in_(ids)).group_by(Submission.node_id, Submission.status)):
                    subs.setdefault(nid, {})[status] = int(n)
                versions = dict(s.execute(select(Assignment.node_id, func.max(Assignment.policy_version))
                                          .where(Assignment.node_id.in_(ids), Assignment.id > self._recent_id(s))
                                          .group_by(Assignment.node_id)).all())
        items = []
        for r in rows:
            lg, sb = ledger.get(r.id, {}), subs.get(r.id, {})
            amt = {k: lg.get(k, (0.0, 0))[0] for k in ("stake", "slash", "credit", "revoke")}
            items.append(NodeStats(
                node_id=r.id, status=r.status, throughput=r.throughput, stake=round(amt["stake"] + amt["slash"], 6),
                credits=round(amt["credit"] + amt["revoke"], 6), accepted=sb.get("accepted", 0),
                rejected=sb.get("rejected", 0), pending=sb.get("pending", 0), slashes=lg.get("slash", (0.0, 0))[1],
                slashed=round(-amt["slash"], 6), last_seen=r.last_heartbeat,
                policy_version=None if versions.get(r.id) is None else int(versions[r.id]),
                status_reason=r.status_reason))
        return NodeList(total=int(total), limit=limit, items=items)

    @staticmethod
    def _recent_id(s: Session) -> int:
        """Assignments with a larger id are the newest ``SPREAD_ASSIGNMENTS`` (ids only grow)."""
        return int(s.execute(select(func.coalesce(func.max(Assignment.id), 0))).scalar_one()) - SPREAD_ASSIGNMENTS

    def stats_trainer(self, limit: int = 500) -> TrainerCurves:
        return self._cached(("trainer", limit), lambda: self._trainer(min(limit, MAX_POINTS)))

    def _trainer(self, limit: int) -> TrainerCurves:
        with self.db.tx() as s:
            total = s.execute(select(func.count()).select_from(TrainerMetric)).scalar_one()
            rows = s.execute(select(TrainerMetric.version, TrainerMetric.record)
                             .order_by(TrainerMetric.version.desc()).limit(limit)).all()
        points = [TrainerPoint(version=v, **{k: x for k, x in (values or {}).items() if k in TrainerPoint.model_fields})
                  for v, values in reversed(rows)]
        return TrainerCurves(total=int(total), source="the trainer's step reports (POST /v1/trainer/step)",
                             points=points)

    def stats_policy(self) -> PolicyStats:
        return self._cached(("policy",), self._policy)

    def _policy(self) -> PolicyStats:
        with self.db.tx() as s:
            step, pv = self._state(s)
            latest = (select(Assignment.node_id, func.max(Assignment.policy_version).label("v"))
                      .where(Assignment.id > self._recent_id(s)).group_by(Assignment.node_id).subquery())
            spread = s.execute(select(latest.c.v, func.count()).group_by(latest.c.v)
                               .order_by(latest.c.v.desc()).limit(MAX_VERSIONS)).all()
        servers, key = self._weights
        return PolicyStats(policy_version=pv, step=step, servers=list(servers), public_key=key,
                           spread=[VersionCount(version=int(v), nodes=int(n)) for v, n in spread],
                           spread_basis="nodes by the policy version of their most recent assignment (the version "
                           "they were told to sample with; nodes do not report what they hold)")
