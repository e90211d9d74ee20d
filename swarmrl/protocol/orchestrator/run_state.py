"""The run's position, shared by the services: the trainer's step and policy version (the ``state`` table), the
weight servers nodes fetch from, and the staleness window they are read against. The trainer moves them
(``POST /v1/trainer/step``, ``POST /v1/trainer/weights``); the step carries the trainer's per-version records,
kept for the dashboard (``store_trainer_points``)."""

from __future__ import annotations

import json
import time

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from swarmrl.contract import AsyncWindow
from swarmrl.dashboard.schemas import TrainerPoint
from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.db import Database
from swarmrl.protocol.description import BaseModelRef
from swarmrl.protocol.orchestrator.changes import Changes
from swarmrl.protocol.orchestrator.errors import ProtocolError
from swarmrl.protocol.orchestrator.heartbeat_cache import Mirror
from swarmrl.protocol.schemas import StepReply, StepRequest, WeightsReply, WeightsRequest
from swarmrl.protocol.tables import State, TrainerMetric

MAX_TRAINER_METRICS = 10_000  # versions kept in trainer_metrics


def store_trainer_points(s: Session, points: list[TrainerPoint], now: float | None = None) -> None:
    """Merge the trainer's records into ``trainer_metrics`` (one row per version) and drop the oldest beyond
    ``MAX_TRAINER_METRICS`` versions, inside the caller's transaction (``RunState.set_step``'s; ``Stats.trainer``
    reads them)."""
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


class RunState:
    """Step, policy version and weight servers. ``read`` and ``current`` read the database (the truth: another
    worker process may have moved them); ``cached`` is what this process last wrote or read, for the hot path."""

    def __init__(self, cfg: OrchestratorConfig, db: Database, changes: Changes, mirror: Mirror) -> None:
        self._cfg = cfg
        self._db = db
        self._changes = changes
        self._mirror = mirror
        self.window: AsyncWindow = cfg.contract.window(last_step=cfg.last_step)
        with db.tx() as s:
            for key in ("step", "policy_version"):
                if s.get(State, key) is None:
                    s.add(State(key=key, value="0"))
        self.weights: tuple[list[str], str] = self._load_weights()  # (servers, manifest-signing key)
        self.cached: tuple[int, int] = self.current()

    @staticmethod
    def read(s: Session) -> tuple[int, int]:
        """(step, policy version), inside the caller's transaction."""
        kv = dict(s.execute(select(State.key, State.value).where(State.key.in_(("step", "policy_version")))).all())
        return int(kv["step"]), int(kv["policy_version"])

    def current(self) -> tuple[int, int]:
        with self._db.tx() as s:
            return self.read(s)

    def useful_from(self, step: int) -> int:
        """The oldest step whose work is still of use at ``step`` (demand mode: none the trainer has finished)."""
        return step if self._cfg.groups_per_step else self.window.earliest_useful_step(step)

    def set_step(self, req: StepRequest) -> StepReply:
        """Advance step and policy version (never back), keeping the trainer's records it carries."""
        with self._db.tx() as s:
            step, pv = self.read(s)
            if req.step < step or req.policy_version < pv:
                raise ProtocolError(409, f"step/policy version must not go back (now {step}/{pv})")
            s.get(State, "step").value = str(req.step)
            s.get(State, "policy_version").value = str(req.policy_version)
            if req.metrics:
                store_trainer_points(s, req.metrics)
        self.cached = (req.step, req.policy_version)
        self._changes.bump("work")  # a new step or policy opens work for idle nodes (their heartbeats may wait for it)
        return StepReply(step=req.step, policy_version=req.policy_version)

    def set_weights(self, req: WeightsRequest) -> WeightsReply:
        """The trainer announces its SHARDCAST servers and manifest key (persisted; the config's
        ``shardcast_relays``, when set, still win)."""
        with self._db.tx() as s:
            row = s.get(State, "weights")
            kept = json.loads(row.value).get("base") if row is not None else None  # announced before, kept
            base = req.base.model_dump() if req.base is not None else kept
            value = json.dumps({"servers": req.servers, "public_key": req.public_key, "base": base})
            if row is None:
                s.add(State(key="weights", value=value))
            else:
                row.value = value
        self.weights = self._load_weights()
        self._mirror.dirty_all()  # cached replies name the old servers
        self._changes.bump("work")  # idle nodes waiting for work hear of the servers
        return WeightsReply(servers=self.weights[0], public_key=self.weights[1], base=self.base)

    def announced(self) -> tuple[list[str], str, BaseModelRef | None]:
        """(weight servers, manifest key, base model) as the database holds them now (another server process may
        have taken the trainer's announcement)."""
        a = self._announced()
        return (list(self._cfg.shardcast_relays) or a["servers"], a["public_key"],
                BaseModelRef(**a["base"]) if a.get("base") else None)

    def _announced(self) -> dict:
        with self._db.tx() as s:
            row = s.get(State, "weights")
            return json.loads(row.value) if row is not None else {"servers": [], "public_key": ""}

    def _load_weights(self) -> tuple[list[str], str]:
        """Weight servers: the config's ``shardcast_relays`` if set, else what the trainer announced (persisted);
        and the base model it published as version 0 (``base``; None before it announces one)."""
        announced = self._announced()
        base = announced.get("base")
        self.base: BaseModelRef | None = BaseModelRef(**base) if base else None
        return (list(self._cfg.shardcast_relays) or announced["servers"], announced["public_key"])
