"""Stats: the run as operators see it. The dashboard's views (``GET /v1/stats/...``, models in
``swarmrl.dashboard.schemas``): nodes with their stake, credits, verdicts and slashes, the trainer's curves (posted
with its step: ``run_state.store_trainer_points``), the policy version and its spread, the validation queue; and the
operators' counts: health, the metrics file's snapshots, the database gauges of the Prometheus metrics. Every
dashboard answer is bounded (at most ``MAX_NODES`` nodes, ``MAX_POINTS`` points; per-node figures are queried for
the listed nodes only) and reused for ``STATS_CACHE_S``, so polling dashboards cost the database a few grouped
queries a second however many there are."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from swarmrl.dashboard.schemas import (
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
from swarmrl.protocol.orchestrator.run_state import RunState
from swarmrl.protocol.orchestrator.telemetry import Telemetry
from swarmrl.protocol.schemas import Health
from swarmrl.protocol.tables import Assignment, LedgerEntry, Node, Submission, TrainerMetric

STATS_CACHE_S = 1.0
SPREAD_ASSIGNMENTS = 20_000  # the policy-version spread looks at this many newest assignments


class Stats:
    """Read-only views of the database (``RunState`` for step, version and weight servers; ``Telemetry`` for the
    counters and the metrics file)."""

    def __init__(self, cfg: OrchestratorConfig, db: Database, run: RunState, telemetry: Telemetry) -> None:
        self._cfg = cfg
        self._db = db
        self._run = run
        self._telemetry = telemetry
        self._cache: dict[tuple, tuple[float, Any]] = {}  # the dashboard's answers, reused for STATS_CACHE_S
        self._last_snapshot = 0.0

    def _cached(self, key: tuple, make: Callable[[], Any]) -> Any:
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < STATS_CACHE_S:
            return hit[1]
        value = make()
        self._cache[key] = (now, value)
        return value

    # ---- views -------------------------------------------------------------------------------------
    def overview(self) -> Overview:
        """Step, policy version, worker nodes by status, the validation queue and verdict counts."""
        return self._cached(("overview",), self._overview)

    def _overview(self) -> Overview:
        with self._db.tx() as s:
            step, pv = self._run.read(s)
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
                        nodes={k: int(v) for k, v in nodes.items()}, validation=q,
                        counters=dict(self._telemetry.counters))

    def nodes(self, limit: int = MAX_NODES) -> NodeList:
        """Worker nodes (at most ``limit``, active first, then by throughput) with their ledger and verdicts."""
        return self._cached(("nodes", limit), lambda: self._nodes(min(limit, MAX_NODES)))

    def _nodes(self, limit: int) -> NodeList:
        with self._db.tx() as s:
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

    def trainer(self, limit: int = 500) -> TrainerCurves:
        """The trainer's newest ``limit`` policy-version records."""
        return self._cached(("trainer", limit), lambda: self._trainer(min(limit, MAX_POINTS)))

    def _trainer(self, limit: int) -> TrainerCurves:
        with self._db.tx() as s:
            total = s.execute(select(func.count()).select_from(TrainerMetric)).scalar_one()
            rows = s.execute(select(TrainerMetric.version, TrainerMetric.record)
                             .order_by(TrainerMetric.version.desc()).limit(limit)).all()
        points = [TrainerPoint(version=v, **{k: x for k, x in (values or {}).items() if k in TrainerPoint.model_fields})
                  for v, values in reversed(rows)]
        return TrainerCurves(total=int(total), source="the trainer's step reports (POST /v1/trainer/step)",
                             points=points)

    def policy(self) -> PolicyStats:
        """The current policy version, the weight servers announced to nodes and the nodes per version."""
        return self._cached(("policy",), self._policy)

    def _policy(self) -> PolicyStats:
        with self._db.tx() as s:
            step, pv = self._run.read(s)
            latest = (select(Assignment.node_id, func.max(Assignment.policy_version).label("v"))
                      .where(Assignment.id > self._recent_id(s)).group_by(Assignment.node_id).subquery())
            spread = s.execute(select(latest.c.v, func.count()).group_by(latest.c.v)
                               .order_by(latest.c.v.desc()).limit(MAX_VERSIONS)).all()
        servers, key = self._run.weights
        return PolicyStats(policy_version=pv, step=step, servers=list(servers), public_key=key,
                           spread=[VersionCount(version=int(v), nodes=int(n)) for v, n in spread],
                           spread_basis="nodes by the policy version of their most recent assignment (the version "
                           "they were told to sample with; nodes do not report what they hold)")

    # ---- operators' counts -------------------------------------------------------------------------------
    def health(self) -> Health:
        with self._db.tx() as s:
            step, pv = self._run.read(s)
            n = s.execute(select(func.count()).select_from(Node).where(Node.role == "worker",
                                                                         Node.status == "active")).scalar_one()
        return Health(ok=True, step=step, policy_version=pv, nodes_active=int(n))

    def snapshot(self) -> dict[str, Any]:
        """Counts by state, for the metrics file and operators."""
        with self._db.tx() as s:
            step, pv = self._run.read(s)
            nodes = dict(s.execute(select(Node.status, func.count()).where(Node.role == "worker")
                                   .group_by(Node.status)).all())
            subs = dict(s.execute(select(Submission.status, func.count()).group_by(Submission.status)).all())
        return {"step": step, "policy_version": pv, **{f"nodes_{k}": int(v) for k, v in nodes.items()},
                **{f"submissions_{k}": int(v) for k, v in subs.items()}, **self._telemetry.counters}

    def gauges(self) -> tuple[int, int, dict[str, int]]:
        """Step, policy version and worker nodes by status (one GROUP BY): the database gauges of ``GET /metrics``."""
        with self._db.tx() as s:
            step, pv = self._run.read(s)
            nodes = s.execute(select(Node.status, func.count()).where(Node.role == "worker").group_by(Node.status))
            return step, pv, {k: int(v) for k, v in nodes.all()}

    def maybe_write_snapshot(self, now: float | None = None) -> None:
        """A snapshot row in the metrics file, at most every ``metrics_interval_s`` (the sweeper calls it)."""
        now = time.monotonic() if now is None else now
        if now - self._last_snapshot >= self._cfg.metrics_interval_s:
            self._last_snapshot = now
            self._telemetry.write(event="snapshot", **self.snapshot())
