"""Membership: the principals the config names (validators, trainers, stake authorities), stake deposits,
registration (locking deposited stake), a node's public record, and the sweep that declares silent nodes dead and
puts their work, and in demand mode the work of idle nodes, back up for reassignment (``orphans``)."""

from __future__ import annotations

import logging
import time

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.db import Database
from swarmrl.protocol.orchestrator.auth import Auth
from swarmrl.protocol.orchestrator.changes import Changes
from swarmrl.protocol.orchestrator.errors import Principal, ProtocolError
from swarmrl.protocol.orchestrator.ledger import Ledger
from swarmrl.protocol.orchestrator.orphans import Orphans, dirty
from swarmrl.protocol.orchestrator.run_state import RunState
from swarmrl.protocol.schemas import DepositReply, DepositRequest, NodeInfo, RegisterReply, RegisterRequest
from swarmrl.protocol.signing import node_id_for
from swarmrl.protocol.tables import Node

log = logging.getLogger("swarmrl.protocol.orchestrator")  # one logger for the whole orchestrator

PRINCIPAL_ROLES = ("validator", "trainer", "authority")


class Membership:
    """Joining and liveness. ``up_since``: when this process started taking heartbeats (no node missed one
    before)."""

    def __init__(self, cfg: OrchestratorConfig, db: Database, auth: Auth, ledger: Ledger, orphans: Orphans,
                 changes: Changes, run: RunState | None = None) -> None:
        self._cfg = cfg
        self._run = run  # the base model the trainer announced (registrations serving another are refused)
        self._db = db
        self._auth = auth
        self._ledger = ledger
        self._orphans = orphans
        self._changes = changes
        self.up_since = time.time()

    def install_principals(self) -> None:
        """The config's validator, trainer and stake authority keys get their roles; keys dropped from the config
        lose them (re-listing them restores them)."""
        cfg = self._cfg
        now = time.time()
        by_role = {"validator": cfg.validator_keys, "trainer": cfg.trainer_keys, "authority": cfg.stake_authority_keys}
        with self._db.tx() as s:
            for role, keys in by_role.items():
                for k in keys:
                    nid = node_id_for(k)
                    node = s.get(Node, nid)
                    if node is None:
                        s.add(Node(id=nid, public_key=k, role=role, status="active", hardware={}, throughput=0.0,
                                   registered_at=now, last_heartbeat=now))
                    elif node.role != role and node.status != "ejected":
                        node.role = role
            listed = {k for keys in by_role.values() for k in keys}
            for node in s.execute(select(Node).where(Node.role.in_(PRINCIPAL_ROLES))).scalars():
                if node.public_key not in listed:
                    node.role = "retired"

    def deposit(self, p: Principal, req: DepositRequest, now: float | None = None) -> DepositReply:
        """A stake authority funds a node (registered or not yet): a ``deposit`` row in the ledger."""
        now = time.time() if now is None else now
        if p.role != "authority":
            raise ProtocolError(403, "only a stake authority key may deposit stake")
        nid = req.node_id or node_id_for(req.public_key)
        with self._db.tx() as s:
            node = s.get(Node, nid)
            if node is not None and node.role != "worker":
                raise ProtocolError(409, f"node {nid} is a {node.role}, not a worker: it holds no stake")
            row, avail = self._ledger.deposit(s, nid, req.amount, now=now, note=f"deposited by stake authority "
                                              f"{p.node_id}" + (f": {req.note}" if req.note else ""))
        log.info("stake authority %s deposited %.1f for %s (available %.1f)", p.node_id, req.amount, nid, avail)
        return DepositReply(node_id=nid, amount=req.amount, deposited=avail, entry_id=row.id)

    def register(self, p: Principal, req: RegisterRequest, now: float | None = None) -> RegisterReply:
        """Join, locking ``req.stake`` of the node's deposit (or, with ``self_declared_stake``, whatever it says)."""
        now = time.time() if now is None else now
        if req.stake < self._cfg.min_stake:
            raise ProtocolError(422, f"stake {req.stake} is below the minimum {self._cfg.min_stake}")
        base = self._run.announced()[2] if self._run is not None and req.base_model is not None else None
        if req.base_model is not None and base is not None and req.base_model != base.blake3:
            raise ProtocolError(422, f"this node serves base model {req.base_model[:16]}..., the run's is "
                                     f"{base.blake3[:16]}... (GET /v1/run names it; `swarmrl node join` fetches it)")
        try:
            with self._db.tx() as s:
                node = s.get(Node, p.node_id)
                if node is not None:
                    raise ProtocolError(409, f"node {p.node_id} is already registered ({node.status})")
                if not self._cfg.self_declared_stake:
                    avail = self._ledger.available(s, p.node_id)
                    if req.stake > avail:
                        # with Retry-After: a deposit may be on its way (a node started beside its stake authority)
                        raise ProtocolError(403, f"stake {req.stake} is not backed by a deposit: {avail} deposited "
                                                 f"for node {p.node_id}; a stake authority must deposit it first "
                                                 "(POST /v1/ledger/deposits)", retry_after=1.0)
                s.add(Node(id=p.node_id, public_key=p.public_key, role="worker", status="active",
                           hardware=req.hardware, throughput=req.throughput, registered_at=now, last_heartbeat=now))
                s.flush()
                self._ledger.lock_stake(s, p.node_id, req.stake, now)
        except IntegrityError:
            raise ProtocolError(409, f"node {p.node_id} is already registered") from None
        log.info("registered node %s (throughput %.1f tok/s, stake %.1f)", p.node_id, req.throughput, req.stake)
        return RegisterReply(node_id=p.node_id, heartbeat_interval_s=self._cfg.heartbeat_interval_s,
                             stake_locked=req.stake)

    def node_info(self, node_id: str) -> NodeInfo:
        """A node's public record (``GET /v1/nodes/{id}``); 404 for an unknown one."""
        with self._db.tx() as s:
            n = s.get(Node, node_id)
            if n is None:
                raise ProtocolError(404, f"no node {node_id}")
            return NodeInfo(node_id=n.id, role=n.role, status=n.status, throughput=n.throughput,
                            last_heartbeat=n.last_heartbeat, status_reason=n.status_reason)

    def sweep(self, now: float | None = None) -> list[str]:
        """Mark nodes that missed ``dead_after_missed`` heartbeats dead, orphan their open work (demand mode: also
        the open work of nodes silent for ``idle_after_missed`` intervals, and work older than
        ``assignment_timeout_s``), drop old nonces. Returns the nodes it declared dead."""
        cfg = self._cfg
        now = time.time() if now is None else now
        # heartbeats are only missed while this orchestrator is up to take them: after a restart every node's last
        # beat is as old as the outage, and blaming them would put honest nodes' work in progress up for others.
        # (A caller sweeping a simulated clock from before start-up, as tests do, gets no such grace.)
        cutoff = now - cfg.heartbeat_interval_s * cfg.dead_after_missed
        idle_cutoff = now - cfg.heartbeat_interval_s * cfg.idle_after_missed
        if now >= self.up_since:
            cutoff = cutoff if cutoff >= self.up_since else float("-inf")
            idle_cutoff = idle_cutoff if idle_cutoff >= self.up_since else float("-inf")
        with self._db.tx() as s:
            dead = s.execute(select(Node).where(Node.role == "worker", Node.status == "active",
                                                Node.last_heartbeat < cutoff)).scalars().all()
            ids = [n.id for n in dead]
            for n in dead:
                n.status, n.status_reason = "dead", f"missed {cfg.dead_after_missed} heartbeats"
            dirty(s, *ids)  # their heartbeat answers change (``Mirror``)
            self._orphans.of_nodes(s, ids)
            if cfg.groups_per_step and cfg.idle_after_missed:
                # a node that took work and fell silent (an idle sybil, a stalled node) stops holding it
                if holders := self._orphans.of_silent_nodes(s, idle_cutoff):
                    log.info("%d assignments of silent nodes are up for reassignment", len(holders))
            if cfg.groups_per_step and cfg.assignment_timeout_s:
                if holders := self._orphans.expired(s, now - cfg.assignment_timeout_s):
                    log.info("%d assignments timed out; up for reassignment", len(holders))
            self._auth.expire_nonces(s, now)
            # look for orphaned work each sweep: bounds any missed update of the hint to one sweep interval
            waiting = self._orphans.recheck(s)
            put_up = bool(s.info["dirty"])  # this sweep marked nodes dead or orphaned work
        if put_up and waiting:
            self._changes.bump("work")  # idle nodes waiting for work may take it (not again each sweep it stays up)
        for i in ids:
            log.info("node %s is dead; its open assignments are up for reassignment", i)
        return ids
