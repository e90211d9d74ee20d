"""The orchestrator service (no HTTP): ``Orchestrator`` holds the configuration, database, content store,
rate limiter and in-memory state, and the run's state (step, policy version, weight servers); the rest of
its behaviour comes from one mixin per responsibility (``auth``, ``membership``, ``assigning``,
``submissions``, ``views``, ``stats``: the dashboard's). Every state change is a database transaction."""

from __future__ import annotations

import json
import time
from pathlib import Path

from sqlalchemy import select

from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.db import Database, sqlite_url
from swarmrl.protocol.models import Node, Nonce, State
from swarmrl.protocol.orchestrator.assigning import AssigningMixin
from swarmrl.protocol.orchestrator.auth import AuthMixin, RateLimiter
from swarmrl.protocol.orchestrator.changes import Changes
from swarmrl.protocol.orchestrator.errors import ProtocolError
from swarmrl.protocol.orchestrator.hot import BeatWriter, Mirror, NonceCache
from swarmrl.protocol.orchestrator.membership import MembershipMixin
from swarmrl.protocol.orchestrator.metrics import OrchestratorMetrics
from swarmrl.protocol.orchestrator.stats import StatsMixin
from swarmrl.protocol.orchestrator.submissions import SubmissionsMixin
from swarmrl.protocol.orchestrator.views import ViewsMixin
from swarmrl.protocol.schemas import StepReply, StepRequest, WeightsReply, WeightsRequest
from swarmrl.protocol.signing import node_id_for
from swarmrl.protocol.store import ContentStore


class Orchestrator(AuthMixin, MembershipMixin, AssigningMixin, SubmissionsMixin, ViewsMixin, StatsMixin):
    def __init__(self, cfg: OrchestratorConfig, db: Database | None = None) -> None:
        self.cfg = cfg
        self.window = cfg.contract.window(last_step=cfg.last_step)
        data = Path(cfg.data_dir)
        data.mkdir(parents=True, exist_ok=True)
        self.db = db or Database(cfg.database_url or sqlite_url(data / "orchestrator.db"))
        self.db.create_all()
        self.store = ContentStore(data / "store")
        self.limiter = RateLimiter(cfg.rate_limit_per_s, cfg.rate_limit_burst)
        # False only after a query found no orphaned assignment and nothing was orphaned since
        # (this process is the only writer of assignment states)
        self._orphans_hint = True
        self.counters = {"heartbeats": 0, "uploads": 0, "refused": 0}
        self.prom = OrchestratorMetrics(self.gauges)  # Prometheus, GET /metrics
        self._metrics = None
        self._last_metrics = 0.0
        self._stats_cache: dict = {}  # the dashboard's stats answers, reused for a second (``stats``)
        self._install_principals()
        self._weights = self._load_weights()
        # the heartbeat hot path (``assigning.HotPathMixin``): in memory, rebuilt from the database on demand
        self.mirror = Mirror()
        self.nonces = NonceCache(cfg.max_nonces)
        self.beat_writer = BeatWriter(self._write_beats, cfg.max_heartbeat_queue)
        self.changes = Changes()  # long polls: validators (uploads), the trainer's adapter (verdicts), idle nodes (work)
        self.up_since = time.time()  # no node missed a heartbeat before this (``sweep``)
        self.fast_heartbeats = cfg.fast_heartbeats and cfg.workers == 1  # the mirror needs the only writer
        self.db.after_commit = self._after_commit
        self._current = self.current()
        with self.db.tx() as s:
            self._orphans_hint = self._orphans_exist(s)
        if self.fast_heartbeats:
            self.load_mirror()
        now = time.time()
        with self.db.tx() as s:
            self.nonces.load(s.execute(select(Nonce.public_key, Nonce.nonce, Nonce.expires_at)
                                       .where(Nonce.expires_at >= now)).all())

    def _after_commit(self, info: dict) -> None:
        """A transaction that changed nodes or assignments committed: drop what the mirror knew of them."""
        if info.get("dirty_all"):
            self.mirror.dirty_all()
        elif info.get("dirty"):
            self.mirror.dirty(info["dirty"])

    def close(self) -> None:
        """Stop the heartbeat writer (after committing what it holds) and release the database."""
        self.beat_writer.close()
        self.db.dispose()

    # ---- state -------------------------------------------------------------------------------
    def _install_principals(self) -> None:
        now = time.time()
        with self.db.tx() as s:
            for role, keys in (("validator", self.cfg.validator_keys), ("trainer", self.cfg.trainer_keys),
                               ("authority", self.cfg.stake_authority_keys)):
                for k in keys:
                    nid = node_id_for(k)
                    node = s.get(Node, nid)
                    if node is None:
                        s.add(Node(id=nid, public_key=k, role=role, status="active", hardware={}, throughput=0.0,
                                   registered_at=now, last_heartbeat=now))
                    elif node.role != role and node.status != "ejected":
                        node.role = role
            # keys dropped from the config lose their powers (re-listing them restores them)
            listed = set(self.cfg.validator_keys) | set(self.cfg.trainer_keys) | set(self.cfg.stake_authority_keys)
            for node in s.execute(select(Node).where(Node.role.in_(("validator", "trainer", "authority")))).scalars():
                if node.public_key not in listed:
                    node.role = "retired"
            for key, default in (("step", "0"), ("policy_version", "0")):
                if s.get(State, key) is None:
                    s.add(State(key=key, value=default))

    def _load_weights(self) -> tuple[list[str], str]:
        """Weight servers: the config's ``shardcast_relays`` if set, else what the trainer announced (persisted)."""
        with self.db.tx() as s:
            row = s.get(State, "weights")
            announced = json.loads(row.value) if row is not None else {"servers": [], "public_key": ""}
        return (list(self.cfg.shardcast_relays) or announced["servers"], announced["public_key"])

    def set_weights(self, req: WeightsRequest) -> WeightsReply:
        with self.db.tx() as s:
            row = s.get(State, "weights")
            value = json.dumps({"servers": req.servers, "public_key": req.public_key})
            if row is None:
                s.add(State(key="weights", value=value))
            else:
                row.value = value
        self._weights = self._load_weights()
        self.mirror.dirty_all()  # cached replies name the old servers
        self.changes.bump("work")  # idle nodes waiting for work hear of the servers
        return WeightsReply(servers=self._weights[0], public_key=self._weights[1])

    @staticmethod
    def _state(s) -> tuple[int, int]:  # noqa: ANN001
        kv = dict(s.execute(select(State.key, State.value).where(State.key.in_(("step", "policy_version")))).all())
        return int(kv["step"]), int(kv["policy_version"])

    def current(self) -> tuple[int, int]:
        with self.db.tx() as s:
            return self._state(s)

    # ---- trainer ---------------------------------------------------------------------------------
    def set_step(self, req: StepRequest) -> StepReply:
        with self.db.tx() as s:
            step, pv = self._state(s)
            if req.step < step or req.policy_version < pv:
                raise ProtocolError(409, f"step/policy version must not go back (now {step}/{pv})")
            s.get(State, "step").value = str(req.step)
            s.get(State, "policy_version").value = str(req.policy_version)
            if req.metrics:
                self.store_trainer_metrics(s, req.metrics)
        self._current = (req.step, req.policy_version)
        self.changes.bump("work")  # a new step or policy opens work for idle nodes (their heartbeats may wait for it)
        return StepReply(step=req.step, policy_version=req.policy_version)
