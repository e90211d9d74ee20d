"""Read-only views: a node's ledger balance and info, health, the state snapshot, the metrics file and the
database gauges of the Prometheus metrics."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from swarmrl.protocol import ledger
from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.db import Database
from swarmrl.protocol.models import LedgerEntry, Node, Submission
from swarmrl.protocol.orchestrator.errors import ProtocolError
from swarmrl.protocol.schemas import Balance, Health, LedgerRow, NodeInfo
from swarmrl.utils.metrics import MetricsWriter


class ViewsMixin:
    """Public views and metrics, part of ``Orchestrator`` (state set up by its ``__init__``)."""

    cfg: OrchestratorConfig
    db: Database
    counters: dict[str, int]
    _metrics: MetricsWriter | None
    _last_metrics: float
    _state: Callable[[Any], tuple[int, int]]

    def metrics(self):  # noqa: ANN201
        if self._metrics is None:
            self._metrics = MetricsWriter(self.cfg.metrics_path or Path(self.cfg.data_dir) / "metrics.jsonl")
        return self._metrics

    def snapshot(self) -> dict[str, Any]:
        """Counts by state, for the metrics file and operators."""
        with self.db.tx() as s:
            step, pv = self._state(s)
            nodes = dict(s.execute(select(Node.status, func.count()).where(Node.role == "worker")
                                   .group_by(Node.status)).all())
            subs = dict(s.execute(select(Submission.status, func.count()).group_by(Submission.status)).all())
        return {"step": step, "policy_version": pv, **{f"nodes_{k}": int(v) for k, v in nodes.items()},
                **{f"submissions_{k}": int(v) for k, v in subs.items()}, **self.counters}

    def gauges(self) -> tuple[int, int, dict[str, int]]:
        """Step, policy version and worker nodes by status (one GROUP BY): the database gauges of ``GET /metrics``."""
        with self.db.tx() as s:
            step, pv = self._state(s)
            nodes = s.execute(select(Node.status, func.count()).where(Node.role == "worker").group_by(Node.status))
            return step, pv, {k: int(v) for k, v in nodes.all()}

    def maybe_write_metrics(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if now - self._last_metrics >= self.cfg.metrics_interval_s:
            self._last_metrics = now
            self.metrics().write(event="snapshot", **self.snapshot())

    def balance(self, node_id: str, now: float | None = None) -> Balance:
        with self.db.tx() as s:
            node = s.get(Node, node_id)
            if node is None:
                raise ProtocolError(404, f"no node {node_id}")
            b = ledger.balances(s, node_id, now)
            rows = s.execute(select(LedgerEntry).where(LedgerEntry.node_id == node_id).order_by(LedgerEntry.id)
                             ).scalars().all()
            return Balance(node_id=node_id, status=node.status, stake=b.stake, credits_locked=b.credits_locked,
                           credits_unlocked=b.credits_unlocked, deposited=b.deposited,
                           entries=[LedgerRow(id=r.id, kind=r.kind, amount=r.amount, submission_id=r.submission_id,
                                              ref_id=r.ref_id, unlock_at=r.unlock_at, created_at=r.created_at,
                                              note=r.note) for r in rows])

    def node_info(self, node_id: str) -> NodeInfo:
        with self.db.tx() as s:
            n = s.get(Node, node_id)
            if n is None:
                raise ProtocolError(404, f"no node {node_id}")
            return NodeInfo(node_id=n.id, role=n.role, status=n.status, throughput=n.throughput,
                            last_heartbeat=n.last_heartbeat, status_reason=n.status_reason)

    def health(self) -> Health:
        with self.db.tx() as s:
            step, pv = self._state(s)
            n = s.execute(select(func.count()).select_from(Node).where(Node.role == "worker",
                                                                         Node.status == "active")).scalar_one()
        return Health(ok=True, step=step, policy_version=pv, nodes_active=int(n))
