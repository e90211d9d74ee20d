"""Membership: stake deposits, registration (locking deposited stake), and the sweep that declares silent nodes
dead and puts their work, and in demand mode the work of idle nodes, back up for reassignment."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from swarmrl.protocol import ledger
from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.db import Database
from swarmrl.protocol.models import Assignment, Node, Nonce
from swarmrl.protocol.orchestrator.changes import Changes
from swarmrl.protocol.orchestrator.errors import Principal, ProtocolError
from swarmrl.protocol.orchestrator.hot import NonceCache
from swarmrl.protocol.schemas import DepositReply, DepositRequest, RegisterReply, RegisterRequest
from swarmrl.protocol.signing import node_id_for

log = logging.getLogger("swarmrl.protocol.orchestrator")  # one logger for the whole orchestrator


class MembershipMixin:
    """Joining and liveness, part of ``Orchestrator`` (state set up by its ``__init__``)."""

    cfg: OrchestratorConfig
    db: Database
    nonces: NonceCache
    _orphans_hint: bool
    _orphans_exist: Callable[..., bool]
    changes: Changes
    up_since: float  # when this orchestrator process started taking heartbeats

    def deposit(self, p: Principal, req: DepositRequest, now: float | None = None) -> DepositReply:
        """A stake authority funds a node (registered or not yet): a ``deposit`` row in the ledger."""
        now = time.time() if now is None else now
        if p.role != "authority":
            raise ProtocolError(403, "only a stake authority key may deposit stake")
        nid = req.node_id or node_id_for(req.public_key)
        with self.db.tx() as s:
            node = s.get(Node, nid)
            if node is not None and node.role != "worker":
                raise ProtocolError(409, f"node {nid} is a {node.role}, not a worker: it holds no stake")
            row = ledger.add(s, nid, "deposit", req.amount, now=now,
                             note=f"deposited by stake authority {p.node_id}" + (f": {req.note}" if req.note else ""))
            avail = ledger.deposit_available(s, nid)
        log.info("stake authority %s deposited %.1f for %s (available %.1f)", p.node_id, req.amount, nid, avail)
        return DepositReply(node_id=nid, amount=req.amount, deposited=avail, entry_id=row.id)

    def register(self, p: Principal, req: RegisterRequest, now: float | None = None) -> RegisterReply:
        """Join, locking ``req.stake`` of the node's deposit (or, with ``self_declared_stake``, whatever it says)."""
        now = time.time() if now is None else now
        if req.stake < self.cfg.min_stake:
            raise ProtocolError(422, f"stake {req.stake} is below the minimum {self.cfg.min_stake}")
        try:
            with self.db.tx() as s:
                node = s.get(Node, p.node_id)
                if node is not None:
                    raise ProtocolError(409, f"node {p.node_id} is already registered ({node.status})")
                if not self.cfg.self_declared_stake:
                    avail = ledger.deposit_available(s, p.node_id)
                    if req.stake > avail:
                        # with Retry-After: a deposit may be on its way (a node started beside its stake authority)
                        raise ProtocolError(403, f"stake {req.stake} is not backed by a deposit: {avail} deposited "
                                                 f"for node {p.node_id}; a stake authority must deposit it first "
                                                 "(POST /v1/ledger/deposits)", retry_after=1.0)
                s.add(Node(id=p.node_id, public_key=p.public_key, role="worker", status="active",
                           hardware=req.hardware, throughput=req.throughput, registered_at=now, last_heartbeat=now))
                s.flush()
                ledger.add(s, p.node_id, "stake", req.stake, now=now, note="stake locked at registration")
        except IntegrityError:
            raise ProtocolError(409, f"node {p.node_id} is already registered") from None
        log.info("registered node %s (throughput %.1f tok/s, stake %.1f)", p.node_id, req.throughput, req.stake)
        return RegisterReply(node_id=p.node_id, heartbeat_interval_s=self.cfg.heartbeat_interval_s,
                             stake_locked=req.stake)

    def sweep(self, now: float | None = None) -> list[str]:
        """Mark nodes that missed ``dead_after_missed`` heartbeats dead, orphan their open work (demand mode: also
        the open work of nodes silent for ``idle_after_missed`` intervals, and work older than
        ``assignment_timeout_s``), drop old nonces."""
        now = time.time() if now is None else now
        # heartbeats are only missed while this orchestrator is up to take them: after a restart every node's last
        # beat is as old as the outage, and blaming them would put honest nodes' work in progress up for others.
        # (A caller sweeping a simulated clock from before start-up, as tests do, gets no such grace.)
        cutoff = now - self.cfg.heartbeat_interval_s * self.cfg.dead_after_missed
        idle_cutoff = now - self.cfg.heartbeat_interval_s * self.cfg.idle_after_missed
        if now >= self.up_since:
            cutoff = cutoff if cutoff >= self.up_since else float("-inf")
            idle_cutoff = idle_cutoff if idle_cutoff >= self.up_since else float("-inf")
        with self.db.tx() as s:
            dead = s.execute(select(Node).where(Node.role == "worker", Node.status == "active",
                                                Node.last_heartbeat < cutoff)).scalars().all()
            ids = [n.id for n in dead]
            for n in dead:
                n.status, n.status_reason = "dead", f"missed {self.cfg.dead_after_missed} heartbeats"
            dirty = s.info.setdefault("dirty", set())  # nodes whose heartbeat answer changes (hot.Mirror)
            dirty.update(ids)
            if ids:
                self._orphans_hint = True
                s.execute(update(Assignment).where(Assignment.node_id.in_(ids), Assignment.status == "open")
                          .values(status="orphaned"))
            if self.cfg.groups_per_step and self.cfg.idle_after_missed:
                # a node that took work and fell silent (an idle sybil, a stalled node) stops holding it
                idle = select(Node.id).where(Node.role == "worker", Node.last_heartbeat < idle_cutoff)
                holders = s.execute(update(Assignment).where(Assignment.status == "open", Assignment.node_id.in_(idle))
                                    .values(status="orphaned").returning(Assignment.node_id)
                                    .execution_options(synchronize_session=False)).scalars().all()
                if holders:
                    dirty.update(holders)
                    log.info("%d assignments of silent nodes are up for reassignment", len(holders))
            if self.cfg.groups_per_step and self.cfg.assignment_timeout_s:
                holders = s.execute(update(Assignment).where(
                    Assignment.status == "open", Assignment.created_at < now - self.cfg.assignment_timeout_s)
                    .values(status="orphaned").returning(Assignment.node_id)
                    .execution_options(synchronize_session=False)).scalars().all()
                if holders:
                    dirty.update(holders)
                    log.info("%d assignments timed out; up for reassignment", len(holders))
            s.execute(Nonce.__table__.delete().where(Nonce.expires_at < now))
            # look for orphaned work each sweep: bounds any missed update of the hint to one sweep interval
            self._orphans_hint = self._orphans_exist(s)
            put_up = bool(dirty)  # this sweep marked nodes dead or orphaned work
        self.nonces.purge(now)
        if put_up and self._orphans_hint:
            self.changes.bump("work")  # idle nodes waiting for work may take it (not again each sweep it stays up)
        for i in ids:
            log.info("node %s is dead; its open assignments are up for reassignment", i)
        return ids
