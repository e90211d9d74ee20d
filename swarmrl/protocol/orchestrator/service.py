"""The composition root: ``Orchestrator`` builds the orchestrator's services over one database and hands them out;
it holds no behaviour of its own. Callers reach the services (``orch.assignments.heartbeat(...)``,
``orch.membership.register(...)``); the HTTP layer reaches them through ``app.state.orchestrator``.

What it builds, in dependency order (each gets what it uses at construction, never another's privates):

- shared pieces: ``Database`` (the session factory; SQLite file under ``data_dir`` or the config's URL), the
  ``ContentStore`` of uploaded files, ``Changes`` (long polls), the hot path's ``Mirror``, ``Telemetry``
  (counters, Prometheus, the metrics file), ``Auth`` (signatures, nonces, the per-key rate limit), ``RunState``
  (step, policy version, weight servers), ``Orphans`` (work put back up), ``RunDescriber`` (the signed run
  description joining nodes read);
- services: ``Ledger``, ``Membership``, ``Assignments`` (the full heartbeat path), ``HotPath`` (steady-state
  heartbeats from memory), ``Submissions``, ``Verdicts``, ``DilocoRounds`` (DiLoCo aggregators' reports), ``Stats``.

Every state change is a database transaction, so restarting on the same database loses nothing."""

from __future__ import annotations

from pathlib import Path

from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.content_store import ContentStore
from swarmrl.protocol.db import Database, sqlite_url
from swarmrl.protocol.orchestrator.assignments import Assignments
from swarmrl.protocol.orchestrator.auth import Auth, RateLimiter
from swarmrl.protocol.orchestrator.changes import Changes
from swarmrl.protocol.orchestrator.describe import RunDescriber
from swarmrl.protocol.orchestrator.diloco import DilocoRounds
from swarmrl.protocol.orchestrator.heartbeat_cache import Mirror, NonceCache
from swarmrl.protocol.orchestrator.hot_path import HotPath
from swarmrl.protocol.orchestrator.ledger import Ledger
from swarmrl.protocol.orchestrator.membership import Membership
from swarmrl.protocol.orchestrator.orphans import Orphans
from swarmrl.protocol.orchestrator.run_state import RunState
from swarmrl.protocol.orchestrator.stats import Stats
from swarmrl.protocol.orchestrator.submissions import Submissions
from swarmrl.protocol.orchestrator.telemetry import Telemetry
from swarmrl.protocol.orchestrator.verdicts import Verdicts


class Orchestrator:
    """The services of one orchestrator process over ``db`` (built from the config when not given)."""

    def __init__(self, cfg: OrchestratorConfig, db: Database | None = None) -> None:
        self.cfg = cfg
        data = Path(cfg.data_dir)
        data.mkdir(parents=True, exist_ok=True)
        self.db = db or Database(cfg.database_url or sqlite_url(data / "orchestrator.db"))
        self.db.create_all()
        self.store = ContentStore(data / "store")
        self.changes = Changes()  # long polls: validators (uploads), the trainer's adapter (verdicts), idle nodes (work)
        self.mirror = Mirror()  # the hot path's answers, dropped for what each commit changed
        self.telemetry = Telemetry(cfg)
        self.auth = Auth(cfg, self.db, NonceCache(cfg.max_nonces), RateLimiter(cfg.rate_limit_per_s,
                                                                              cfg.rate_limit_burst))
        self.ledger = Ledger(cfg, self.db)
        self.run = RunState(cfg, self.db, self.changes, self.mirror)
        self.orphans = Orphans(self.db, self.run)
        self.membership = Membership(cfg, self.db, self.auth, self.ledger, self.orphans, self.changes, self.run)
        self.membership.install_principals()
        self.assignments = Assignments(cfg, self.db, self.run, self.auth, self.orphans, self.mirror, self.changes,
                                       self.telemetry)
        self.hot_path = HotPath(cfg, self.db, self.run, self.auth, self.orphans, self.assignments, self.mirror,
                                self.telemetry)
        self.submissions = Submissions(cfg, self.db, self.store, self.run, self.assignments, self.orphans,
                                       self.changes, self.telemetry)
        self.verdicts = Verdicts(self.db, self.ledger, self.orphans, self.changes, self.telemetry)
        self.diloco = DilocoRounds(self.db, self.ledger, self.verdicts, self.changes, self.telemetry)
        self.stats = Stats(cfg, self.db, self.run, self.telemetry)
        self.describer = RunDescriber(cfg, self.run)
        self.telemetry.prom.watch_state(self.stats.gauges)
        self.db.after_commit = self.mirror.after_commit
        if self.hot_path.enabled:
            self.hot_path.load_mirror()
        self.auth.load_nonces()

    def close(self) -> None:
        """Stop the heartbeat writer (after committing what it holds) and release the database."""
        self.hot_path.close()
        self.telemetry.close()
        self.db.dispose()
