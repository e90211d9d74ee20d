"""Prometheus metrics of the orchestrator (served at ``GET /metrics`` by ``http``).

One ``CollectorRegistry`` per ``Orchestrator`` (never the process-wide default: tests build many in one
process), held by its ``Telemetry``. Event counters are plain ``prometheus_client`` counters incremented beside
``Telemetry.counters`` (an ``inc()`` is a fraction of a microsecond); the gauges of database state (worker nodes by
status, step, policy version) are read at scrape time by one query (``Stats.gauges``), cached for ``gauge_ttl_s``
so scrapes cannot load the database. No fastapi here: the services import this module."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["OrchestratorMetrics", "NODE_STATUSES", "SUBMISSION_OUTCOMES"]

NODE_STATUSES = ("active", "dead", "ejected")  # always exported (0 when none), others as they appear
# uploaded: stored, pending validation; refused: an upload the orchestrator refused (401/404/409/413/422/429);
# accepted / rejected: the validator's first verdict; challenged: an accepted one rejected inside its challenge
# window; ejected: pending ones rejected without a verdict because their node was ejected
SUBMISSION_OUTCOMES = ("uploaded", "refused", "accepted", "rejected", "challenged", "ejected")
# upload -> verdict: seconds (a validator keeping up) to an hour (one that fell behind)
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)

# (step, policy version, worker nodes by status), read in one transaction
StateReader = Callable[[], tuple[int, int, dict[str, int]]]


class _StateCollector(Collector):
    """The gauges read from the database, by ``read`` at most once per ``ttl_s`` (a scrape in between gets the
    cached values)."""

    def __init__(self, read: StateReader, ttl_s: float) -> None:
        self.read, self.ttl_s = read, ttl_s
        self._lock = threading.Lock()  # one query at a time however many scrapes arrive (not on any hot path)
        self._at = -float("inf")
        self._value: tuple[int, int, dict[str, int]] = (0, 0, {})

    def _current(self) -> tuple[int, int, dict[str, int]]:
        with self._lock:
            now = time.monotonic()
            if now - self._at >= self.ttl_s:
                self._value, self._at = self.read(), now
            return self._value

    def collect(self) -> Iterator[GaugeMetricFamily]:
        step, pv, nodes = self._current()
        g = GaugeMetricFamily("swarmrl_orchestrator_nodes", "Registered worker nodes by status", labels=["status"])
        for status in sorted(set(NODE_STATUSES) | set(nodes)):
            g.add_metric([status], nodes.get(status, 0))
        yield g
        yield GaugeMetricFamily("swarmrl_orchestrator_step", "Current training step", value=step)
        yield GaugeMetricFamily("swarmrl_orchestrator_policy_version", "Current policy version", value=pv)


class OrchestratorMetrics:
    """The orchestrator's metrics in their own registry; ``read_state`` (optional) feeds the database gauges."""

    def __init__(self, read_state: StateReader | None = None, gauge_ttl_s: float = 5.0) -> None:
        r = self.registry = CollectorRegistry(auto_describe=False)
        self.heartbeats = Counter("swarmrl_orchestrator_heartbeats", "Authenticated heartbeats handled", registry=r)
        assignments = Counter("swarmrl_orchestrator_assignments_created", "Assignment rows created, by kind "
                              "(new work, or a take-over of another node's orphaned work)", ["kind"], registry=r)
        self.assignments_new = assignments.labels("new")
        self.assignments_reassigned = assignments.labels("reassigned")
        self.declines = Counter("swarmrl_orchestrator_assignments_declined", "Open assignments declined by their "
                                "holder (put back up for other nodes)", registry=r)
        self.submissions = Counter("swarmrl_orchestrator_submissions", "Submissions by outcome", ["outcome"],
                                   registry=r)
        for o in SUBMISSION_OUTCOMES:
            self.submissions.labels(o)
        self.validation_latency = Histogram("swarmrl_orchestrator_validation_latency_seconds",
                                            "Seconds from a submission's upload to its first verdict",
                                            buckets=LATENCY_BUCKETS, registry=r)
        self.slashes = Counter("swarmrl_orchestrator_slashes", "Slashes (rejections and successful challenges)",
                               registry=r)
        self.stake_slashed = Counter("swarmrl_orchestrator_stake_slashed", "Stake slashed, in ledger units",
                                     registry=r)
        self.upload_bytes = Counter("swarmrl_orchestrator_upload_bytes_received",
                                    "Bytes of rollout uploads received (streamed in full under the byte cap)",
                                    registry=r)
        self.file_bytes = Counter("swarmrl_orchestrator_submission_bytes_served",
                                  "Bytes of submission files served to validators and trainers", registry=r)
        self.refused = Counter("swarmrl_orchestrator_refused_requests", "Requests refused with a protocol error, "
                               "by HTTP status", ["status"], registry=r)
        self.state: _StateCollector | None = None
        if read_state is not None:
            self.watch_state(read_state, gauge_ttl_s)

    def watch_state(self, read_state: StateReader, gauge_ttl_s: float = 5.0) -> None:
        """Export the database gauges, read by ``read_state`` at most once per ``gauge_ttl_s`` (once per registry)."""
        if self.state is not None:
            raise ValueError("the database gauges are exported already")
        self.state = _StateCollector(read_state, gauge_ttl_s)
        self.registry.register(self.state)

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric (``prometheus_client.CONTENT_TYPE_LATEST``)."""
        return generate_latest(self.registry)
