"""Heartbeats and assignments: seeded work per node and step, demand mode (``_step_in_need``) and the
reassignment of orphaned work to live nodes.

Reassigned work: the rows with one ``(origin_node_id, step, round)`` (so one seed) are one piece of work, a
*family*: the original holder's row and one row per node that took it over. At most one row of a family is
``open`` or ``orphaned`` at a time (taking an orphan marks it ``reassigned``); any holder whose row is not closed
may still upload it, the first upload completes the family (``SubmissionsMixin.accept_upload`` closes the other
rows) and the others get one 409. A node taking over work of a family it already has a row in (its own work,
come back to it) gets that row re-opened, never a second one.

The hot path (``fast_heartbeat``): a node whose work at the current step is assigned already and has nothing to
take over is answered from ``hot.Mirror`` (built by its last full heartbeat), its nonce and liveness committed
in a batch by ``hot.BeatWriter`` before the reply. Any other state goes the full path, in one transaction."""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from sqlalchemy import Float, String, bindparam, column, func, select, update, values
from sqlalchemy.exc import IntegrityError

from swarmrl.contract import AsyncWindow, Demand, RLContract, assigned_tasks, task_seed, thinking_budget
from swarmrl.envs.config import TaskConfig
from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.db import Database
from swarmrl.protocol.models import Assignment, Node, Nonce, Submission
from swarmrl.protocol.orchestrator.changes import Changes
from swarmrl.protocol.orchestrator.errors import Principal, ProtocolError
from swarmrl.protocol.orchestrator.hot import Beat, BeatWriter, HotNode, Mirror, NonceCache, Overloaded
from swarmrl.protocol.orchestrator.metrics import OrchestratorMetrics
from swarmrl.protocol.schemas import AssignmentSpec, HeartbeatReply, HeartbeatRequest, TaskSpec
from swarmrl.protocol.signing import SignedHeaders, body_sha256

log = logging.getLogger("swarmrl.protocol.orchestrator")  # one logger for the whole orchestrator

LIVE = ("open", "orphaned", "reassigned")  # rows of a family whose holder may still upload them


def family(a: Assignment) -> tuple:
    """Where-clauses selecting every row of ``a``'s family (the same seeded work, whoever holds it)."""
    return (Assignment.origin_node_id == a.origin_node_id, Assignment.step == a.step,
            Assignment.round == (a.round or 0))

@functools.lru_cache(maxsize=65536)
def _tasks(env: str, params_json: str, seed: int, n: int) -> tuple[TaskSpec, ...]:
    return tuple(TaskSpec(task_id=t.task_id, prompt=t.prompt)
                 for t in assigned_tasks(env, json.loads(params_json), seed, n))


class AssigningMixin:
    """Heartbeat and assignment logic, part of ``Orchestrator`` (state set up by its ``__init__``)."""

    cfg: OrchestratorConfig
    window: AsyncWindow
    db: Database
    counters: dict[str, int]
    prom: OrchestratorMetrics
    _orphans_hint: bool
    _weights: tuple[list[str], str]
    _state: Callable[[Any], tuple[int, int]]
    _verify: Callable[..., SignedHeaders]
    _admit: Callable[..., Principal]
    _remember_nonce: Callable[[SignedHeaders], float]
    mirror: Mirror
    nonces: NonceCache
    beat_writer: BeatWriter
    fast_heartbeats: bool
    _current: tuple[int, int]
    changes: Changes

    def _spec(self, a: Assignment) -> AssignmentSpec:
        tasks = _tasks(a.env, json.dumps(a.env_params or {}, sort_keys=True), a.seed, a.n_tasks)
        return AssignmentSpec(assignment_id=a.id, step=a.step, policy_version=a.policy_version, seed=a.seed,
                              contract=self._contract_of(a.env, json.dumps(a.env_params or {}, sort_keys=True),
                                                         a.group_size),
                              target_length=a.target_length, tasks=list(tasks), round=a.round or 0,
                              reassigned_from=a.origin_node_id if a.origin_node_id != a.node_id else None)

    def _contract_of(self, env: str, params_json: str, group_size: int) -> RLContract:
        """The run's contract with an assignment's own task and group size (stored with the assignment when it
        was made: they stay what the node was told, whatever the configuration says now)."""
        c = self.cfg.contract
        if c.task.name == env and c.group_size == group_size and json.dumps(c.task.params, sort_keys=True) == params_json:
            return c
        return c.model_copy(update={"task": TaskConfig(name=env, params=json.loads(params_json)),
                                    "group_size": group_size})

    def _new_assignment(self, node: Node, origin: str, seed: int, step: int, pv: int, now: float,
                        parent: int | None = None, round: int = 0) -> Assignment:
        cfg = self.cfg
        c = cfg.contract
        a = Assignment(node_id=node.id, origin_node_id=origin, step=step, seed=seed, env=c.task.name,
                       env_params=dict(c.task.params), n_tasks=cfg.tasks_per_node, group_size=c.group_size,
                       policy_version=pv, round=round,
                       target_length=thinking_budget(node.throughput, c.budget.tiers, cfg.tasks_per_node,
                                                     c.group_size, c.budget.step_time_s) if c.budget.enabled else None,
                       status="open", parent_id=parent, created_at=now)
        (self.prom.assignments_new if parent is None else self.prom.assignments_reassigned).inc()
        return a

    def heartbeat(self, p: Principal, req: HeartbeatRequest, now: float | None = None) -> HeartbeatReply:
        now = time.time() if now is None else now
        gen = self.mirror.generation(p.node_id)
        try:
            with self.db.tx() as s:
                reply, hot = self._heartbeat_in(s, p, req, now)
        except IntegrityError:
            raise ProtocolError(409, "concurrent heartbeat; retry") from None
        if hot is not None:
            self.mirror.install(p.node_id, gen, hot)
        return reply

    def signed_heartbeat(self, method: str, path: str, headers: Any, actual_sha256: str, req: HeartbeatRequest,
                         now: float | None = None, verified: SignedHeaders | None = None,
                         wait: float = 0.0) -> HeartbeatReply:
        """Authentication and the heartbeat in one transaction (the full path; ``fast_heartbeat`` answers the
        steady state without it). ``verified``: the headers ``fast_heartbeat`` checked already. With ``wait``, a
        reply without assignments is held until work may have opened (``Changes`` kind "work": a new step or
        policy, announced weights, a rejection, released or orphaned work) or ``wait`` seconds passed, then the
        heartbeat is answered again; at most ``Changes.max_waiters["work"]`` are held at once (beyond: answered
        at once with ``long_poll = False``, so the node sleeps its interval)."""
        seen = self.changes.generation("work")  # before looking: a change after the look ends the wait
        p, reply = self._signed_heartbeat(method, path, headers, actual_sha256, req, now, verified)
        if wait <= 0 or reply.assignments:
            return reply
        gen, held = self.changes.wait_waited("work", seen, wait)
        if gen != seen:
            return self.heartbeat(p, req)
        reply.long_poll = held
        return reply

    def _signed_heartbeat(self, method: str, path: str, headers: Any, actual_sha256: str, req: HeartbeatRequest,
                          now: float | None, verified: SignedHeaders | None) -> tuple[Principal, HeartbeatReply]:
        now = time.time() if now is None else now
        h = verified if verified is not None else self._verify(method, path, headers, actual_sha256, now)
        gen = self.mirror.generation(h.node_id)
        try:
            with self.db.tx() as s:
                p = self._admit(s, h, ("worker",), False)
                reply, hot = self._heartbeat_in(s, p, req, now)
        except IntegrityError as e:
            if "nonce" in str(e.orig).lower():
                raise ProtocolError(401, "replayed nonce") from None
            raise ProtocolError(409, "concurrent heartbeat; retry") from None
        if hot is not None:
            self.mirror.install(h.node_id, gen, hot)
        return p, reply

    # ---- the hot path ----------------------------------------------------------------------------
    def load_mirror(self) -> int:
        """Mirror every active worker whose heartbeat needs no write but its own (at start-up: a restarted
        orchestrator answers its known nodes from memory at once). Returns how many were mirrored."""
        cfg = self.cfg
        step, _pv = self._current
        demand = cfg.groups_per_step > 0
        lo = self._useful_from(step)
        epoch = self.mirror.generation("")[0]
        with self.db.tx() as s:
            nodes = s.execute(select(Node.id, Node.public_key, Node.last_heartbeat).where(
                Node.role == "worker", Node.status == "active")).all()
            held: dict[str, list[Assignment]] = {}
            for a in s.execute(select(Assignment).where(Assignment.step >= lo).order_by(Assignment.id)).scalars():
                held.setdefault(a.node_id, []).append(a)
        n = 0
        for nid, pk, last in nodes:
            mine = held.get(nid, [])
            ready = any(a.status == "open" for a in mine) if demand else \
                any(a.step == step and a.origin_node_id == nid for a in mine)
            if ready and self.mirror.install(nid, (epoch, self.mirror.generation(nid)[1]),
                                             HotNode(pk, last, step, None, rows=[a for a in mine if a.status == "open"])):
                n += 1
        return n

    def fast_heartbeat(self, method: str, path: str, headers: Any, body: bytes,
                       now: float | None = None, may_wait: bool = False) -> tuple[SignedHeaders, Future | None, bytes]:
        """A heartbeat answered from memory when the node's state allows (``hot``): returns the verified headers,
        a future completed once the beat's writes are committed (then send the reply bytes), or None when the
        full path must answer (pass it the verified headers). Raises ``ProtocolError`` for a refusal, with the
        same reasons the full path gives. ``may_wait``: the request asks to wait for work (``?wait=``), which only
        the full path does, so a node without work goes there."""
        now = time.time() if now is None else now
        h = self._verify(method, path, headers, body_sha256(body), now)  # 401 / 429 before anything else
        hot = self.mirror.nodes.get(h.node_id)
        if hot is None or not self.fast_heartbeats or hot.public_key != h.public_key:
            return h, None, b""
        cfg = self.cfg
        step, pv = self._current
        demand = cfg.groups_per_step > 0
        if hot.step != step or (demand and not (hot.specs or hot.rows)):
            return h, None, b""  # a new assignment to make (or to look for)
        if not demand and cfg.reassign_per_heartbeat and self._orphans_hint:
            return h, None, b""  # orphaned work may be waiting for a taker
        if demand and cfg.idle_after_missed and now - hot.last_heartbeat > cfg.heartbeat_interval_s * cfg.idle_after_missed:
            return h, None, b""  # its open work was (or is about to be) put back up
        if may_wait and not (hot.specs or hot.rows):
            return h, None, b""  # no work to hand it: the full path waits for some
        try:
            HeartbeatRequest.model_validate_json(body)
        except ValueError:
            return h, None, b""  # the full path answers with the validation errors
        expires = self._remember_nonce(h)
        key = (step, pv, self._weights)
        if hot.specs is None:  # mirrored at start-up: the assignments' tasks are derived on first use
            hot.specs, hot.rows = [self._spec(a) for a in hot.rows], []
        if hot.reply_key != key:
            hot.reply = self._reply(h.node_id, step, pv, hot.specs).model_dump_json().encode()
            hot.reply_key = key
        try:
            fut = self.beat_writer.submit(Beat(h.node_id, h.public_key, h.nonce, expires, now))
        except Overloaded as e:
            raise ProtocolError(503, f"orchestrator overloaded: {e}; retry later", retry_after=1) from None
        self.counters["heartbeats"] += 1
        self.prom.heartbeats.inc()
        return h, fut, hot.reply

    def _write_beats(self, beats: list[Beat]) -> list[bool]:
        """The group commit of ``BeatWriter``: every beat's nonce and liveness in one transaction (a few
        statements whatever the batch size). A nonce the database already holds (another process used it)
        refuses that beat only."""
        try:
            self._write_beats_tx(beats)
            ok = [True] * len(beats)
        except IntegrityError:  # one by one, to find the replayed ones
            ok = []
            for b in beats:
                try:
                    self._write_beats_tx([b])
                    ok.append(True)
                except IntegrityError:
                    ok.append(False)
        for b, good in zip(beats, ok, strict=True):
            if good:
                self.mirror.touch(b.node_id, b.now)
        return ok

    def _write_beats_tx(self, beats: list[Beat], chunk: int = 1000) -> None:
        last: dict[str, float] = {}
        for b in beats:
            last[b.node_id] = max(last.get(b.node_id, 0.0), b.now)
        seen = sorted(last.items())  # one lock order for concurrent writers (PostgreSQL)
        nodes = Node.__table__
        rows = [{"public_key": b.public_key, "nonce": b.nonce, "expires_at": b.expires_at} for b in beats]
        with self.db.tx() as s:
            if self.db.is_sqlite:  # in-process: executemany is a C loop
                s.execute(Nonce.__table__.insert(), rows)
                s.execute(update(nodes).where(nodes.c.id == bindparam("nid")).values(last_heartbeat=bindparam("ts")),
                          [{"nid": n, "ts": t} for n, t in seen])
                return
            # a server: one round trip per statement, not per row
            for i in range(0, len(rows), chunk):
                s.execute(Nonce.__table__.insert().values(rows[i:i + chunk]))
            for i in range(0, len(seen), chunk):
                v = values(column("nid", String), column("ts", Float), name="beats").data(seen[i:i + chunk])
                s.execute(update(nodes).where(nodes.c.id == v.c.nid).values(last_heartbeat=v.c.ts))

    def _heartbeat_in(self, s, p: Principal, req: HeartbeatRequest, now: float) -> tuple[HeartbeatReply, HotNode | None]:  # noqa: ANN001,E501
        cfg = self.cfg
        self.counters["heartbeats"] += 1
        self.prom.heartbeats.inc()
        node = s.get(Node, p.node_id)
        demand = cfg.groups_per_step > 0
        idle = demand and cfg.idle_after_missed and now - node.last_heartbeat > \
            cfg.heartbeat_interval_s * cfg.idle_after_missed  # its open work was (or is about to be) put back up
        node.last_heartbeat = now
        if node.status == "dead" or idle:  # came back: reclaim own orphaned work nobody took
            if node.status == "dead":
                node.status, node.status_reason = "active", None
            s.execute(update(Assignment).where(Assignment.node_id == node.id, Assignment.status == "orphaned")
                      .values(status="open", created_at=now))
        step, pv = self._state(s)
        lo = self._useful_from(step)
        mine = s.execute(select(Assignment).where(Assignment.node_id == node.id, Assignment.step >= lo)
                         .order_by(Assignment.id)).scalars().all()
        if demand:
            # one open assignment per node at a time, orphaned work (same seeds) before new rounds
            if not any(a.status == "open" for a in mine):
                taken = self._take_orphans(s, node, lo, pv, now, min(1, cfg.reassign_per_heartbeat))
                mine.extend(a for a in taken if a not in mine)
                m = None if taken else self._step_in_need(s, step, pv)
                if m is not None:
                    rnd = len([a for a in mine if a.step == m and a.origin_node_id == node.id])
                    a = self._new_assignment(node, node.id, task_seed(node.id, m, cfg.run_secret, rnd), m, pv, now,
                                             round=rnd)
                    s.add(a)
                    mine.append(a)
        else:
            if not any(a.step == step and a.origin_node_id == node.id for a in mine):
                a = self._new_assignment(node, node.id, task_seed(node.id, step, cfg.run_secret), step, pv, now)
                s.add(a)
                mine.append(a)
            taken = self._take_orphans(s, node, lo, pv, now, cfg.reassign_per_heartbeat)
            mine.extend(a for a in taken if a not in mine)
        s.flush()
        specs = [self._spec(a) for a in mine if a.status == "open"]
        reply = self._reply(p.node_id, step, pv, specs)
        hot = HotNode(p.public_key, now, step, specs) if node.status == "active" and node.role == "worker" else None
        return reply, hot

    def _useful_from(self, step: int) -> int:
        """The oldest step whose work is still of use at ``step`` (demand mode: none the trainer has finished)."""
        return step if self.cfg.groups_per_step else self.window.earliest_useful_step(step)

    def _reply(self, node_id: str, step: int, pv: int, specs: list[AssignmentSpec]) -> HeartbeatReply:
        cfg = self.cfg
        return HeartbeatReply(node_id=node_id, step=step, policy_version=pv,
                              heartbeat_interval_s=cfg.heartbeat_interval_s, weight_relays=list(self._weights[0]),
                              weight_pubkey=self._weights[1], assignments=specs, long_poll=True)

    def _orphans_exist(self, s) -> bool:  # noqa: ANN001
        """Is any orphaned work still useful (what ``_take_orphans`` could hand out)?"""
        step, _ = self._state(s)
        return s.execute(select(Assignment.id).where(Assignment.status == "orphaned",
                                                     Assignment.step >= self._useful_from(step))
                         .limit(1)).first() is not None

    def _take_orphans(self, s, node: Node, lo: int, pv: int, now: float, limit: int) -> list[Assignment]:  # noqa: ANN001
        """Up to ``limit`` orphaned assignments (of other holders) for ``node``: a new row of the family, or, when
        the node already has a row in it (its own work come back), that row re-opened."""
        if not limit or not self._orphans_hint:
            return []
        q = (select(Assignment).where(Assignment.status == "orphaned", Assignment.step >= lo,
                                      Assignment.node_id != node.id)
             .order_by(Assignment.id).limit(limit))
        if not self.db.is_sqlite:
            q = q.with_for_update(skip_locked=True)
        found = s.execute(q).scalars().all()
        if not found and s.execute(select(Assignment.id).where(Assignment.status == "orphaned", Assignment.step >= lo)
                                   .limit(1)).first() is None:
            self._orphans_hint = False  # nothing orphaned at all (the node's own orphans do not count as none)
        taken = []
        for o in found:
            own = s.execute(select(Assignment).where(Assignment.node_id == node.id, *family(o))).scalars().first()
            if own is not None and s.execute(select(Submission.id).where(Submission.assignment_id == own.id)
                                             ).first() is not None:
                continue  # the node's copy was uploaded before (and then rejected): not its to redo
            o.status = "reassigned"
            s.info.setdefault("dirty", set()).add(o.node_id)
            if own is None:
                own = self._new_assignment(node, o.origin_node_id, o.seed, o.step, pv, now, parent=o.id,
                                           round=o.round or 0)
                s.add(own)
            else:
                own.status, own.created_at = "open", now
            taken.append(own)
            log.info("reassigned assignment %d (node %s) to %s", o.id, o.node_id, node.id)
        return taken

    def _step_in_need(self, s, step: int, pv: int) -> int | None:  # noqa: ANN001
        """Demand mode: the step that needs work by the contract's rule (``contract.Demand``: the lowest step
        policy ``pv`` may serve, at most ``lookahead`` ahead), counting pending and accepted submissions' usable
        groups and open work as tasks_per_node each times the share of groups recent uploads made usable."""
        cfg = self.cfg
        per_assignment = cfg.tasks_per_node * self._usable_share(s)

        def expected(m: int) -> float:
            have = s.execute(select(func.coalesce(func.sum(Submission.informative), 0)).where(
                Submission.step == m, Submission.status.in_(("pending", "accepted")))).scalar_one()
            held = s.execute(select(func.count()).select_from(Assignment).where(
                Assignment.step == m, Assignment.status.in_(("open", "orphaned")))).scalar_one()
            return int(have) + int(held) * per_assignment

        return Demand(cfg.groups_per_step, cfg.overassign).step_in_need(self.window, pv, step, expected, cfg.lookahead)

    def _usable_share(self, s, recent: int = 64) -> float:  # noqa: ANN001
        """Usable groups per assigned task over the last ``recent`` uploads (groups whose rewards all tie are
        filtered by the trainer): open work is expected to yield that share, not all of its tasks. 1.0 until
        uploads say otherwise; never below 0.1 (a swarm of failing uploads must not get unbounded work)."""
        rows = s.execute(select(Submission.informative, Submission.n_rows).where(
            Submission.status.in_(("pending", "accepted"))).order_by(Submission.id.desc()).limit(recent)).all()
        groups = sum(n for _, n in rows) / max(1, self.cfg.contract.group_size)
        if groups < self.cfg.tasks_per_node:
            return 1.0
        return min(1.0, max(0.1, sum(i for i, _ in rows) / groups))
