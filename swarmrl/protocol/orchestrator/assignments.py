"""Assignment: heartbeats (the full, database path) and the seeded work they hand out: one assignment per node and
step, or in demand mode (``groups_per_step > 0``) one open assignment at a time for the step in need
(``contract.Demand``), orphaned work (``orphans``) before new rounds. A node taking over work of a family it
already has a row in (its own work, come back to it) gets that row re-opened, never a second one; work a node
declined (``Submissions.decline``) is never handed back to it.

The steady state is answered by ``hot_path.HotPath`` from the mirror this path installs (``heartbeat_cache``)."""

from __future__ import annotations

import functools
import json
import logging
import time

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from swarmrl.contract import Demand, RLContract, assigned_tasks, task_seed, thinking_budget
from swarmrl.envs.config import TaskConfig
from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.db import Database
from swarmrl.protocol.orchestrator.auth import Auth, SignedRequest
from swarmrl.protocol.orchestrator.changes import Changes
from swarmrl.protocol.orchestrator.errors import Principal, ProtocolError
from swarmrl.protocol.orchestrator.heartbeat_cache import HotNode, Mirror
from swarmrl.protocol.orchestrator.orphans import Orphans, dirty, family, not_declined_by
from swarmrl.protocol.orchestrator.run_state import RunState
from swarmrl.protocol.orchestrator.telemetry import Telemetry
from swarmrl.protocol.schemas import AssignmentSpec, HeartbeatReply, HeartbeatRequest, TaskSpec
from swarmrl.protocol.signing import SignedHeaders
from swarmrl.protocol.tables import Assignment, Node, Submission

log = logging.getLogger("swarmrl.protocol.orchestrator")  # one logger for the whole orchestrator


@functools.lru_cache(maxsize=65536)
def _tasks(env: str, params_json: str, seed: int, n: int) -> tuple[TaskSpec, ...]:
    return tuple(TaskSpec(task_id=t.task_id, prompt=t.prompt)
                 for t in assigned_tasks(env, json.loads(params_json), seed, n))


class Assignments:
    """Heartbeats and the work they carry. Its public pieces ``spec`` and ``reply`` are what the hot path and the
    validator's pending list show of an assignment."""

    def __init__(self, cfg: OrchestratorConfig, db: Database, run: RunState, auth: Auth, orphans: Orphans,
                 mirror: Mirror, changes: Changes, telemetry: Telemetry) -> None:
        self._cfg = cfg
        self._db = db
        self._run = run
        self._auth = auth
        self._orphans = orphans
        self._mirror = mirror
        self._changes = changes
        self._telemetry = telemetry

    def spec(self, a: Assignment) -> AssignmentSpec:
        """What a node is told of an assignment (its seeded tasks derived again, cached)."""
        params = json.dumps(a.env_params or {}, sort_keys=True)
        tasks = _tasks(a.env, params, a.seed, a.n_tasks)
        return AssignmentSpec(assignment_id=a.id, step=a.step, policy_version=a.policy_version, seed=a.seed,
                              contract=self._contract_of(a.env, params, a.group_size),
                              target_length=a.target_length, tasks=list(tasks), round=a.round or 0,
                              reassigned_from=a.origin_node_id if a.origin_node_id != a.node_id else None)

    def reply(self, node_id: str, step: int, pv: int, specs: list[AssignmentSpec]) -> HeartbeatReply:
        servers, key = self._run.weights
        return HeartbeatReply(node_id=node_id, step=step, policy_version=pv,
                              heartbeat_interval_s=self._cfg.heartbeat_interval_s, weight_relays=list(servers),
                              weight_pubkey=key, assignments=specs, long_poll=True)

    def heartbeat(self, p: Principal, req: HeartbeatRequest, now: float | None = None) -> HeartbeatReply:
        """An admitted node's heartbeat (its liveness; the reply lists its open work, new work made if due)."""
        now = time.time() if now is None else now
        gen = self._mirror.generation(p.node_id)
        try:
            with self._db.tx() as s:
                reply, hot = self._heartbeat_in(s, p, req, now)
        except IntegrityError:
            raise ProtocolError(409, "concurrent heartbeat; retry") from None
        if hot is not None:
            self._mirror.install(p.node_id, gen, hot)
        return reply

    def signed_heartbeat(self, call: SignedRequest, req: HeartbeatRequest, now: float | None = None,
                         verified: SignedHeaders | None = None, wait: float = 0.0) -> HeartbeatReply:
        """Authentication and the heartbeat in one transaction (the full path; ``HotPath.answer`` answers the
        steady state without it). ``verified``: the headers the hot path checked already. With ``wait``, a reply
        without assignments is held until work may have opened (``Changes`` kind "work": a new step or policy,
        announced weights, a rejection, released or orphaned work) or ``wait`` seconds passed, then the heartbeat
        is answered again; at most ``Changes.max_waiters["work"]`` are held at once (beyond: answered at once with
        ``long_poll = False``, so the node sleeps its interval)."""
        seen = self._changes.generation("work")  # before looking: a change after the look ends the wait
        p, reply = self._signed_heartbeat(call, req, now, verified)
        if wait <= 0 or reply.assignments:
            return reply
        gen, held = self._changes.wait_waited("work", seen, wait)
        if gen != seen:
            return self.heartbeat(p, req)
        reply.long_poll = held
        return reply

    def _signed_heartbeat(self, call: SignedRequest, req: HeartbeatRequest, now: float | None,
                          verified: SignedHeaders | None) -> tuple[Principal, HeartbeatReply]:
        now = time.time() if now is None else now
        if verified is None:  # (the hot path verified and paced these headers)
            h = self._auth.verify(call, now)
            self._auth.pace_heartbeat(h, now)
        else:
            h = verified
        gen = self._mirror.generation(h.node_id)
        try:
            with self._db.tx() as s:
                p = self._auth.admit(s, h, ("worker",), False)
                reply, hot = self._heartbeat_in(s, p, req, now)
        except IntegrityError as e:
            if "nonce" in str(e.orig).lower():
                raise ProtocolError(401, "replayed nonce") from None
            raise ProtocolError(409, "concurrent heartbeat; retry") from None
        if hot is not None:
            self._mirror.install(h.node_id, gen, hot)
        return p, reply

    def _heartbeat_in(self, s: Session, p: Principal, req: HeartbeatRequest, now: float
                      ) -> tuple[HeartbeatReply, HotNode | None]:
        cfg = self._cfg
        self._telemetry.heartbeat()
        node = s.get(Node, p.node_id)
        demand = cfg.groups_per_step > 0
        idle = demand and cfg.idle_after_missed and now - node.last_heartbeat > \
            cfg.heartbeat_interval_s * cfg.idle_after_missed  # its open work was (or is about to be) put back up
        node.last_heartbeat = now
        if node.status == "dead" or idle:  # came back: reclaim own orphaned work nobody took (but what it declined)
            if node.status == "dead":
                node.status, node.status_reason = "active", None
            s.execute(update(Assignment).where(Assignment.node_id == node.id, Assignment.status == "orphaned",
                                               not_declined_by(node.id))
                      .values(status="open", created_at=now))
        step, pv = self._run.read(s)
        lo = self._run.useful_from(step)
        mine = list(s.execute(select(Assignment).where(Assignment.node_id == node.id, Assignment.step >= lo)
                              .order_by(Assignment.id)).scalars().all())
        if not cfg.rollouts:
            pass  # liveness only: no rollout work in this run
        elif demand:
            self._demand_work(s, node, mine, step, pv, lo, now)
        else:
            if not any(a.step == step and a.origin_node_id == node.id for a in mine):
                a = self._new_assignment(node, node.id, task_seed(node.id, step, cfg.run_secret), step, pv, now)
                s.add(a)
                mine.append(a)
            taken = self._take_orphans(s, node, lo, pv, now, cfg.reassign_per_heartbeat)
            mine.extend(a for a in taken if a not in mine)
        s.flush()
        specs = [self.spec(a) for a in mine if a.status == "open"]
        reply = self.reply(p.node_id, step, pv, specs)
        hot = HotNode(p.public_key, now, step, specs) if node.status == "active" and node.role == "worker" else None
        return reply, hot

    def _demand_work(self, s: Session, node: Node, mine: list[Assignment], step: int, pv: int, lo: int,
                     now: float) -> None:
        """Demand mode: one open assignment per node at a time, orphaned work (same seeds) before new rounds."""
        if any(a.status == "open" for a in mine):
            return
        taken = self._take_orphans(s, node, lo, pv, now, min(1, self._cfg.reassign_per_heartbeat))
        mine.extend(a for a in taken if a not in mine)
        m = None if taken else self._step_in_need(s, step, pv)
        if m is not None:
            rnd = len([a for a in mine if a.step == m and a.origin_node_id == node.id])
            a = self._new_assignment(node, node.id, task_seed(node.id, m, self._cfg.run_secret, rnd), m, pv, now,
                                     round=rnd)
            s.add(a)
            mine.append(a)

    def _contract_of(self, env: str, params_json: str, group_size: int) -> RLContract:
        """The run's contract with an assignment's own task and group size (stored with the assignment when it
        was made: they stay what the node was told, whatever the configuration says now)."""
        c = self._cfg.contract
        if c.task.name == env and c.group_size == group_size and json.dumps(c.task.params, sort_keys=True) == params_json:
            return c
        return c.model_copy(update={"task": TaskConfig(name=env, params=json.loads(params_json)),
                                    "group_size": group_size})

    def _new_assignment(self, node: Node, origin: str, seed: int, step: int, pv: int, now: float,
                        parent: int | None = None, round: int = 0) -> Assignment:
        cfg = self._cfg
        c = cfg.contract
        a = Assignment(node_id=node.id, origin_node_id=origin, step=step, seed=seed, env=c.task.name,
                       env_params=dict(c.task.params), n_tasks=cfg.tasks_per_node, group_size=c.group_size,
                       policy_version=pv, round=round,
                       target_length=thinking_budget(node.throughput, c.budget.tiers, cfg.tasks_per_node,
                                                     c.group_size, c.budget.step_time_s) if c.budget.enabled else None,
                       status="open", parent_id=parent, created_at=now)
        prom = self._telemetry.prom
        (prom.assignments_new if parent is None else prom.assignments_reassigned).inc()
        return a

    def _take_orphans(self, s: Session, node: Node, lo: int, pv: int, now: float, limit: int) -> list[Assignment]:
        """Up to ``limit`` orphaned assignments (of other holders) for ``node``: a new row of the family, or, when
        the node already has a row in it (its own work come back), that row re-opened."""
        if not limit or not self._orphans.waiting:
            return []
        taken = []
        for o in self._orphans.for_taker(s, node.id, lo, limit, lock=not self._db.is_sqlite):
            own = s.execute(select(Assignment).where(Assignment.node_id == node.id, *family(o))).scalars().first()
            if own is not None and s.execute(select(Submission.id).where(Submission.assignment_id == own.id)
                                             ).first() is not None:
                continue  # the node's copy was uploaded before (and then rejected): not its to redo
            o.status = "reassigned"
            dirty(s, o.node_id)
            if own is None:
                own = self._new_assignment(node, o.origin_node_id, o.seed, o.step, pv, now, parent=o.id,
                                           round=o.round or 0)
                s.add(own)
            else:
                own.status, own.created_at = "open", now
            taken.append(own)
            log.info("reassigned assignment %d (node %s) to %s", o.id, o.node_id, node.id)
        return taken

    def _step_in_need(self, s: Session, step: int, pv: int) -> int | None:
        """Demand mode: the step that needs work by the contract's rule (``contract.Demand``: the lowest step
        policy ``pv`` may serve, at most ``lookahead`` ahead), counting pending and accepted submissions' usable
        groups and open work as tasks_per_node each times the share of groups recent uploads made usable."""
        cfg = self._cfg
        per_assignment = cfg.tasks_per_node * self._usable_share(s)

        def expected(m: int) -> float:
            have = s.execute(select(func.coalesce(func.sum(Submission.informative), 0)).where(
                Submission.step == m, Submission.status.in_(("pending", "accepted")))).scalar_one()
            held = s.execute(select(func.count()).select_from(Assignment).where(
                Assignment.step == m, Assignment.status.in_(("open", "orphaned")))).scalar_one()
            return int(have) + int(held) * per_assignment

        return Demand(cfg.groups_per_step, cfg.overassign).step_in_need(self._run.window, pv, step, expected,
                                                                        cfg.lookahead)

    def _usable_share(self, s: Session, recent: int = 64) -> float:
        """Usable groups per assigned task over the last ``recent`` uploads (groups whose rewards all tie are
        filtered by the trainer): open work is expected to yield that share, not all of its tasks. 1.0 until
        uploads say otherwise; never below 0.1 (a swarm of failing uploads must not get unbounded work)."""
        rows = s.execute(select(Submission.informative, Submission.n_rows).where(
            Submission.status.in_(("pending", "accepted"))).order_by(Submission.id.desc()).limit(recent)).all()
        groups = sum(n for _, n in rows) / max(1, self._cfg.contract.group_size)
        if groups < self._cfg.tasks_per_node:
            return 1.0
        return min(1.0, max(0.1, sum(i for i, _ in rows) / groups))
