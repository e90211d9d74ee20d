"""What the orchestrator counts and records, shared by the services and the HTTP layer: the event counters of this
process (in every snapshot of the metrics file and the dashboard's overview), the Prometheus metrics
(``metrics.OrchestratorMetrics``) and the JSONL metrics file (``<data_dir>/metrics.jsonl``: snapshots and one row
per verdict)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.orchestrator.metrics import OrchestratorMetrics
from swarmrl.utils.metrics import MetricsWriter


class Telemetry:
    """Counts and records of one orchestrator process (in memory but the metrics file; nothing depends on them)."""

    def __init__(self, cfg: OrchestratorConfig) -> None:
        self.counters = {"heartbeats": 0, "uploads": 0, "refused": 0}
        self.prom = OrchestratorMetrics()  # Prometheus, GET /metrics (its database gauges: ``prom.watch_state``)
        self._path = cfg.metrics_path or Path(cfg.data_dir) / "metrics.jsonl"
        self._file: MetricsWriter | None = None  # opened on the first row

    def heartbeat(self) -> None:
        """An authenticated heartbeat was handled (either path)."""
        self.counters["heartbeats"] += 1
        self.prom.heartbeats.inc()

    def uploaded(self) -> None:
        self.counters["uploads"] += 1
        self.prom.submissions.labels("uploaded").inc()

    def declined(self) -> None:
        """A node declined an open assignment (it went back up for others)."""
        self.prom.declines.inc()

    def refused(self, status: int, upload: bool = False) -> None:
        """A request refused with a protocol error (``upload``: an upload, also counted as a refused submission)."""
        self.counters["refused"] += 1
        self.prom.refused.labels(str(status)).inc()
        if upload:
            self.prom.submissions.labels("refused").inc()

    def write(self, **row: Any) -> None:
        """One row of the metrics file (``event`` names its kind)."""
        if self._file is None:
            self._file = MetricsWriter(self._path)
        self._file.write(**row)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
