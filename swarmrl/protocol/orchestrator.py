"""The orchestrator: membership, signed requests, seeded assignments, uploads, verdicts, ledger.

``Orchestrator`` is the service logic over the database (no HTTP); ``create_app`` wraps it in a
FastAPI app whose request/response bodies are the pydantic models in ``schemas`` (so the API is
documented by its OpenAPI schema at ``/openapi.json``). Every state change is a database
transaction, so restarting the process on the same database loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable

from fastapi import Depends, FastAPI, Path as PathParam, Query, Request
from fastapi.responses import FileResponse, JSONResponse
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from starlette.concurrency import run_in_threadpool

from swarmrl.protocol import ledger
from swarmrl.protocol.assignment import assigned_tasks, task_seed, thinking_budget
from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.db import Database, sqlite_url
from swarmrl.protocol.models import Assignment, Node, Nonce, State, Submission
from swarmrl.protocol.schemas import (AcceptedList, AssignmentSpec, Balance, ErrorBody, Health, HeartbeatReply,
                                      HeartbeatRequest, LedgerRow, NodeInfo, PendingList, PendingSubmission,
                                      RegisterReply, RegisterRequest, StepReply, StepRequest, SubmissionInfo,
                                      SubmissionDetail, SubmitReply, TaskSpec, VerdictReply, VerdictRequest,
                                      WeightsReply, WeightsRequest)
from swarmrl.protocol.signing import (SignatureError, SignedHeaders, body_sha256, check_timestamp, node_id_for,
                                      parse_headers, verify_signature)
from swarmrl.protocol.store import ContentStore, UploadTooLarge

log = logging.getLogger("swarmrl.protocol.orchestrator")

UPLOAD_PREFIX = "/v1/submissions/upload/"
MAX_ID = 2**62
IdParam = Annotated[int, PathParam(ge=1, le=MAX_ID)]


@functools.lru_cache(maxsize=65536)
def _tasks(env: str, params_json: str, seed: int, n: int) -> tuple[TaskSpec, ...]:
    return tuple(TaskSpec(task_id=t.task_id, prompt=t.prompt)
                 for t in assigned_tasks(env, json.loads(params_json), seed, n))


class ProtocolError(Exception):
    """A request refused with an HTTP status and a reason (becomes ``{"detail": reason}``)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass(frozen=True)
class Principal:
    node_id: str
    public_key: str
    role: str
    content_sha256: str


class RateLimiter:
    """Token bucket per key, in memory (a restart refills buckets; nothing else depends on it)."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._b: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def allow(self, key: str, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        with self._lock:
            tokens, last = self._b.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - last) * self.rate)
            if tokens < 1.0:
                self._b[key] = (tokens, now)
                return False
            self._b[key] = (tokens - 1.0, now)
            if len(self._b) > 200_000:  # bound memory under key churn
                self._b.clear()
            return True


class Orchestrator:
    def __init__(self, cfg: OrchestratorConfig, db: Database | None = None) -> None:
        self.cfg = cfg
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
        self._metrics = None
        self._last_metrics = 0.0
        self._install_principals()
        self._weights = self._load_weights()

    # ---- state -------------------------------------------------------------------------------
    def _install_principals(self) -> None:
        now = time.time()
        with self.db.tx() as s:
            for role, keys in (("validator", self.cfg.validator_keys), ("trainer", self.cfg.trainer_keys)):
                for k in keys:
                    nid = node_id_for(k)
                    node = s.get(Node, nid)
                    if node is None:
                        s.add(Node(id=nid, public_key=k, role=role, status="active", hardware={}, throughput=0.0,
                                   registered_at=now, last_heartbeat=now))
                    elif node.role != role and node.status != "ejected":
                        node.role = role
            # keys dropped from the config lose their powers (re-listing them restores them)
            listed = set(self.cfg.validator_keys) | set(self.cfg.trainer_keys)
            for node in s.execute(select(Node).where(Node.role.in_(("validator", "trainer")))).scalars():
                if node.public_key not in listed:
                    node.role = "retired"
            for key, default in (("step", "0"), ("policy_version", "0")):
                if s.get(State, key) is None:
                    s.add(State(key=key, value=default))

    def _load_weights(self) -> tuple[list[str], str]:
        """Weight servers: the config's ``shardcast_relays`` if set, else what the trainer announced (persisted)."""
        import json

        with self.db.tx() as s:
            row = s.get(State, "weights")
            announced = json.loads(row.value) if row is not None else {"servers": [], "public_key": ""}
        return (list(self.cfg.shardcast_relays) or announced["servers"], announced["public_key"])

    def set_weights(self, req: WeightsRequest) -> WeightsReply:
        import json

        with self.db.tx() as s:
            row = s.get(State, "weights")
            value = json.dumps({"servers": req.servers, "public_key": req.public_key})
            if row is None:
                s.add(State(key="weights", value=value))
            else:
                row.value = value
        self._weights = self._load_weights()
        return WeightsReply(servers=self._weights[0], public_key=self._weights[1])

    @staticmethod
    def _state(s) -> tuple[int, int]:  # noqa: ANN001
        kv = dict(s.execute(select(State.key, State.value).where(State.key.in_(("step", "policy_version")))).all())
        return int(kv["step"]), int(kv["policy_version"])

    def current(self) -> tuple[int, int]:
        with self.db.tx() as s:
            return self._state(s)

    # ---- authentication ------------------------------------------------------------------------
    def _verify(self, method: str, path: str, headers: Any, actual_sha256: str | None, now: float) -> SignedHeaders:
        """The checks that need no database: header syntax, clock skew, signature, body hash, rate."""
        try:
            h = parse_headers(headers)
            check_timestamp(h.timestamp, self.cfg.max_clock_skew_s, now)
            verify_signature(h, method, path)
        except SignatureError as e:
            raise ProtocolError(401, str(e)) from None
        if actual_sha256 is not None and actual_sha256 != h.content_sha256:
            raise ProtocolError(401, "body does not match the signed content hash (tampered or corrupted)")
        if not self.limiter.allow(h.public_key):
            raise ProtocolError(429, "rate limit exceeded for this key")
        return h

    def _admit(self, s, h: SignedHeaders, roles: tuple[str, ...], allow_unregistered: bool) -> Principal:  # noqa: ANN001
        """Key lookup, ejection and role checks, and the nonce (inside the caller's transaction)."""
        nid = h.node_id
        node = s.get(Node, nid)
        if node is None:
            if not allow_unregistered:
                raise ProtocolError(401, "unknown key: register first")
            role = "worker"
        else:
            if node.public_key != h.public_key:
                raise ProtocolError(401, "key does not match the registered node")
            if node.status == "ejected":
                raise ProtocolError(403, f"node is ejected: {node.status_reason or 'slashed'}")
            role = node.role
        if roles and role not in roles:
            raise ProtocolError(403, f"role {role!r} may not call this endpoint")
        # the primary key (public_key, nonce) makes a reused nonce fail the insert
        s.execute(Nonce.__table__.insert().values(public_key=h.public_key, nonce=h.nonce,
                                                  expires_at=h.timestamp + self.cfg.max_clock_skew_s + 1.0))
        return Principal(nid, h.public_key, role, h.content_sha256)

    def authenticate(self, method: str, path: str, headers: Any, actual_sha256: str | None,
                     roles: tuple[str, ...], allow_unregistered: bool = False, now: float | None = None) -> Principal:
        now = time.time() if now is None else now
        h = self._verify(method, path, headers, actual_sha256, now)
        try:
            with self.db.tx() as s:
                return self._admit(s, h, roles, allow_unregistered)
        except IntegrityError:
            raise ProtocolError(401, "replayed nonce") from None

    # ---- membership ----------------------------------------------------------------------------
    def register(self, p: Principal, req: RegisterRequest, now: float | None = None) -> RegisterReply:
        now = time.time() if now is None else now
        if req.stake < self.cfg.min_stake:
            raise ProtocolError(422, f"stake {req.stake} is below the minimum {self.cfg.min_stake}")
        try:
            with self.db.tx() as s:
                node = s.get(Node, p.node_id)
                if node is not None:
                    raise ProtocolError(409, f"node {p.node_id} is already registered ({node.status})")
                s.add(Node(id=p.node_id, public_key=p.public_key, role="worker", status="active",
                           hardware=req.hardware, throughput=req.throughput, registered_at=now, last_heartbeat=now))
                s.flush()
                ledger.add(s, p.node_id, "stake", req.stake, now=now, note="stake locked at registration")
        except IntegrityError:
            raise ProtocolError(409, f"node {p.node_id} is already registered") from None
        log.info("registered node %s (throughput %.1f tok/s, stake %.1f)", p.node_id, req.throughput, req.stake)
        return RegisterReply(node_id=p.node_id, heartbeat_interval_s=self.cfg.heartbeat_interval_s,
                             stake_locked=req.stake)

    def _spec(self, a: Assignment) -> AssignmentSpec:
        tasks = _tasks(a.env, json.dumps(a.env_params or {}, sort_keys=True), a.seed, a.n_tasks)
        return AssignmentSpec(assignment_id=a.id, step=a.step, policy_version=a.policy_version, seed=a.seed, env=a.env,
                              env_params=a.env_params or {}, group_size=a.group_size, target_length=a.target_length,
                              tasks=list(tasks), round=a.round or 0,
                              reassigned_from=a.origin_node_id if a.origin_node_id != a.node_id else None,
                              **({"budget_prompt_format": self.cfg.budget_prompt_format,
                                  "budget_penalty": self.cfg.budget_penalty} if a.target_length is not None else {}))

    def _new_assignment(self, node: Node, origin: str, seed: int, step: int, pv: int, now: float,
                        parent: int | None = None, round: int = 0) -> Assignment:
        cfg = self.cfg
        a = Assignment(node_id=node.id, origin_node_id=origin, step=step, seed=seed, env=cfg.task.name,
                       env_params=dict(cfg.task.params), n_tasks=cfg.tasks_per_node, group_size=cfg.group_size,
                       policy_version=pv, round=round,
                       target_length=thinking_budget(node.throughput, cfg.budget_tiers, cfg.tasks_per_node,
                                                     cfg.group_size, cfg.target_step_time_s),
                       status="open", parent_id=parent, created_at=now)
        return a

    def heartbeat(self, p: Principal, req: HeartbeatRequest, now: float | None = None) -> HeartbeatReply:
        now = time.time() if now is None else now
        try:
            with self.db.tx() as s:
                return self._heartbeat_in(s, p, req, now)
        except IntegrityError:
            raise ProtocolError(409, "concurrent heartbeat; retry") from None

    def signed_heartbeat(self, method: str, path: str, headers: Any, actual_sha256: str, req: HeartbeatRequest,
                         now: float | None = None) -> HeartbeatReply:
        """Authentication and the heartbeat in one transaction (the hot path)."""
        now = time.time() if now is None else now
        h = self._verify(method, path, headers, actual_sha256, now)
        try:
            with self.db.tx() as s:
                p = self._admit(s, h, ("worker",), False)
                return self._heartbeat_in(s, p, req, now)
        except IntegrityError as e:
            if "nonce" in str(e.orig).lower():
                raise ProtocolError(401, "replayed nonce") from None
            raise ProtocolError(409, "concurrent heartbeat; retry") from None

    def _heartbeat_in(self, s, p: Principal, req: HeartbeatRequest, now: float) -> HeartbeatReply:  # noqa: ANN001
        cfg = self.cfg
        self.counters["heartbeats"] += 1
        node = s.get(Node, p.node_id)
        node.last_heartbeat = now
        if node.status == "dead":  # came back: reclaim own orphaned work nobody took
            node.status, node.status_reason = "active", None
            s.execute(update(Assignment).where(Assignment.node_id == node.id, Assignment.status == "orphaned")
                      .values(status="open"))
        step, pv = self._state(s)
        demand = cfg.groups_per_step > 0
        # demand mode: work for steps the trainer has finished is of no use any more
        lo = step if demand else step - cfg.async_window
        mine = s.execute(select(Assignment).where(Assignment.node_id == node.id, Assignment.step >= lo)
                         .order_by(Assignment.id)).scalars().all()
        if demand:
            if not any(a.status == "open" for a in mine):
                m = self._step_in_need(s, step, pv)
                if m is not None:
                    rnd = len([a for a in mine if a.step == m and a.origin_node_id == node.id])
                    a = self._new_assignment(node, node.id, task_seed(node.id, m, cfg.run_secret, rnd), m, pv, now,
                                             round=rnd)
                    s.add(a)
                    mine.append(a)
        elif not any(a.step == step and a.origin_node_id == node.id for a in mine):
            a = self._new_assignment(node, node.id, task_seed(node.id, step, cfg.run_secret), step, pv, now)
            s.add(a)
            mine.append(a)
        if cfg.reassign_per_heartbeat and self._orphans_hint:
            q = (select(Assignment).where(Assignment.status == "orphaned", Assignment.step >= lo,
                                          Assignment.node_id != node.id)
                 .order_by(Assignment.id).limit(cfg.reassign_per_heartbeat))
            if not self.db.is_sqlite:
                q = q.with_for_update(skip_locked=True)
            taken = s.execute(q).scalars().all()
            if not taken:
                self._orphans_hint = False
            for o in taken:
                o.status = "reassigned"
                a = self._new_assignment(node, o.origin_node_id, o.seed, o.step, pv, now, parent=o.id,
                                         round=o.round or 0)
                s.add(a)
                mine.append(a)
                log.info("reassigned assignment %d (node %s) to %s", o.id, o.node_id, node.id)
        s.flush()
        specs = [self._spec(a) for a in mine if a.status == "open"]
        return HeartbeatReply(node_id=p.node_id, step=step, policy_version=pv, async_window=cfg.async_window,
                              heartbeat_interval_s=cfg.heartbeat_interval_s, weight_relays=list(self._weights[0]),
                              weight_pubkey=self._weights[1], assignments=specs)

    def _step_in_need(self, s, step: int, pv: int) -> int | None:  # noqa: ANN001
        """Demand mode: the lowest step in [step, step + lookahead] (never ahead of pv + async_window, never
        past last_step) whose usable groups, counting open work as tasks_per_node each, are short."""
        from sqlalchemy import func

        cfg = self.cfg
        need = cfg.groups_per_step * cfg.overassign
        hi = min(step + cfg.lookahead, pv + cfg.async_window)
        if cfg.last_step >= 0:
            hi = min(hi, cfg.last_step)
        for m in range(step, hi + 1):
            have = s.execute(select(func.coalesce(func.sum(Submission.informative), 0)).where(
                Submission.step == m, Submission.status.in_(("pending", "accepted")))).scalar_one()
            held = s.execute(select(func.count()).select_from(Assignment).where(
                Assignment.step == m, Assignment.status.in_(("open", "orphaned")))).scalar_one()
            if int(have) + int(held) * cfg.tasks_per_node < need:
                return m
        return None

    def sweep(self, now: float | None = None) -> list[str]:
        """Mark nodes that missed ``dead_after_missed`` heartbeats dead, orphan their open work, drop old nonces."""
        now = time.time() if now is None else now
        cutoff = now - self.cfg.heartbeat_interval_s * self.cfg.dead_after_missed
        with self.db.tx() as s:
            dead = s.execute(select(Node).where(Node.role == "worker", Node.status == "active",
                                                Node.last_heartbeat < cutoff)).scalars().all()
            ids = [n.id for n in dead]
            for n in dead:
                n.status, n.status_reason = "dead", f"missed {self.cfg.dead_after_missed} heartbeats"
            if ids:
                self._orphans_hint = True
                s.execute(update(Assignment).where(Assignment.node_id.in_(ids), Assignment.status == "open")
                          .values(status="orphaned"))
            if self.cfg.groups_per_step and self.cfg.assignment_timeout_s:
                res = s.execute(update(Assignment).where(
                    Assignment.status == "open", Assignment.created_at < now - self.cfg.assignment_timeout_s)
                    .values(status="orphaned"))
                if res.rowcount:
                    log.info("%d assignments timed out; up for reassignment", res.rowcount)
            s.execute(Nonce.__table__.delete().where(Nonce.expires_at < now))
        # re-arm the orphan query each sweep: bounds any missed update of the hint to one sweep interval
        self._orphans_hint = True
        for i in ids:
            log.info("node %s is dead; its open assignments are up for reassignment", i)
        return ids

    def metrics(self):  # noqa: ANN201
        from swarmrl.utils.metrics import MetricsWriter

        if self._metrics is None:
            self._metrics = MetricsWriter(self.cfg.metrics_path or Path(self.cfg.data_dir) / "metrics.jsonl")
        return self._metrics

    def snapshot(self) -> dict[str, Any]:
        """Counts by state, for the metrics file and operators."""
        from sqlalchemy import func

        with self.db.tx() as s:
            step, pv = self._state(s)
            nodes = dict(s.execute(select(Node.status, func.count()).where(Node.role == "worker")
                                   .group_by(Node.status)).all())
            subs = dict(s.execute(select(Submission.status, func.count()).group_by(Submission.status)).all())
        return {"step": step, "policy_version": pv, **{f"nodes_{k}": int(v) for k, v in nodes.items()},
                **{f"submissions_{k}": int(v) for k, v in subs.items()}, **self.counters}

    def maybe_write_metrics(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if now - self._last_metrics >= self.cfg.metrics_interval_s:
            self._last_metrics = now
            self.metrics().write(event="snapshot", **self.snapshot())

    # ---- submissions -----------------------------------------------------------------------------
    def precheck_upload(self, p: Principal, assignment_id: int) -> None:
        with self.db.tx() as s:
            a = s.get(Assignment, assignment_id)
            if a is None or a.node_id != p.node_id:
                raise ProtocolError(404, f"assignment {assignment_id} is not assigned to this node")
            if a.status != "open":
                raise ProtocolError(409, f"assignment {assignment_id} is {a.status}, not open")
            self._check_duplicate(s, p, p.content_sha256)

    def release_assignment(self, p: Principal, assignment_id: int, reason: str) -> None:
        """Demand mode: an upload for this assignment was refused (invalid / oversized): put it back up for
        reassignment so the step is not starved by a node that cannot deliver."""
        if not self.cfg.groups_per_step:
            return
        with self.db.tx() as s:
            a = s.get(Assignment, assignment_id)
            if a is not None and a.node_id == p.node_id and a.status == "open":
                a.status = "orphaned"
                self._orphans_hint = True
                log.info("assignment %d released after a refused upload from %s: %s", assignment_id, p.node_id,
                         reason[:200])

    @staticmethod
    def _check_duplicate(s, p: Principal, sha: str) -> None:  # noqa: ANN001
        dup = s.execute(select(Submission).where(Submission.sha256 == sha)).scalars().first()
        if dup is not None:
            who = "this node" if dup.node_id == p.node_id else "another node (replay)"
            raise ProtocolError(409, f"file {sha[:16]}... was already submitted by {who}")

    def accept_upload(self, p: Principal, assignment_id: int, tmp: Path, sha: str, size: int,
                      now: float | None = None) -> SubmitReply:
        from swarmrl.rl.rollouts import RolloutError, RolloutLimits, read_rollouts

        now = time.time() if now is None else now
        try:
            try:
                rows = read_rollouts(tmp, RolloutLimits(max_bytes=self.cfg.max_upload_bytes, max_rows=self.cfg.max_rows))
            except RolloutError as e:
                raise ProtocolError(422, f"invalid rollout file: {e}") from None
            if not rows:
                raise ProtocolError(422, "invalid rollout file: no rows")
            with self.db.tx() as s:
                a = s.get(Assignment, assignment_id)
                if a is None or a.node_id != p.node_id or a.status != "open":
                    raise ProtocolError(409, f"assignment {assignment_id} is no longer open for this node")
                bad = next((r for r in rows if r.worker_id != p.node_id or r.step != a.step), None)
                if bad is not None:
                    raise ProtocolError(422, f"rows must carry worker_id={p.node_id} and step={a.step} "
                                             f"(got {bad.worker_id!r}, {bad.step})")
                self._check_duplicate(s, p, sha)
                sub = Submission(assignment_id=a.id, node_id=p.node_id, step=a.step, sha256=sha, size=size,
                                 n_rows=len(rows), informative=self._usable_groups(rows, a.group_size),
                                 status="pending", checks=[], created_at=now)
                s.add(sub)
                s.flush()
                a.status = "submitted"
                self.store.commit(tmp, sha)
                reply = SubmitReply(submission_id=sub.id, sha256=sha, n_rows=len(rows), status="pending")
        except IntegrityError:
            raise ProtocolError(409, "duplicate submission (same file or assignment)") from None
        finally:
            self.store.discard(tmp)
        self.counters["uploads"] += 1
        log.info("submission %d from %s: %d rows, %s", reply.submission_id, p.node_id, reply.n_rows, sha[:12])
        return reply

    def _usable_groups(self, rows, group_size: int) -> int:  # noqa: ANN001
        """Complete groups the trainer can use: with distinct rewards unless tied groups count too."""
        groups: dict[str, list[float]] = {}
        for r in rows:
            groups.setdefault(r.group_id, []).append(r.reward)
        complete = [g for g in groups.values() if len(g) == group_size]
        if self.cfg.count_tied_groups:
            return len(complete)
        return sum(1 for g in complete if max(g) - min(g) > 1e-9)

    def submission_path(self, submission_id: int) -> Path:
        with self.db.tx() as s:
            sub = s.get(Submission, submission_id)
            if sub is None:
                raise ProtocolError(404, f"no submission {submission_id}")
            path = self.store.path_for(sub.sha256)
        if not path.is_file():
            raise ProtocolError(410, f"file of submission {submission_id} is missing from the store")
        return path

    def submission(self, submission_id: int) -> SubmissionDetail:
        with self.db.tx() as s:
            sub = s.get(Submission, submission_id)
            if sub is None:
                raise ProtocolError(404, f"no submission {submission_id}")
            return SubmissionDetail(**self._info(sub).model_dump(), checks=sub.checks or [],
                                    validator_id=sub.validator_id, validated_at=sub.validated_at)

    @staticmethod
    def _info(sub: Submission) -> SubmissionInfo:
        return SubmissionInfo(submission_id=sub.id, node_id=sub.node_id, assignment_id=sub.assignment_id, step=sub.step,
                              sha256=sub.sha256, size=sub.size, n_rows=sub.n_rows, status=sub.status,
                              reason=sub.reason, created_at=sub.created_at, informative=sub.informative or 0)

    # ---- validation ------------------------------------------------------------------------------
    def pending(self, limit: int) -> PendingList:
        with self.db.tx() as s:
            step, pv = self._state(s)
            subs = s.execute(select(Submission).where(Submission.status == "pending").order_by(Submission.id)
                             .limit(limit)).scalars().all()
            items = []
            for sub in subs:
                a = s.get(Assignment, sub.assignment_id)
                items.append(PendingSubmission(submission=self._info(sub), assignment=self._spec(a),
                                               origin_node_id=a.origin_node_id, current_step=step,
                                               current_policy_version=pv, async_window=self.cfg.async_window))
        return PendingList(items=items)

    def verdict(self, p: Principal, req: VerdictRequest, now: float | None = None) -> VerdictReply:
        now = time.time() if now is None else now
        checks = [c.model_dump() for c in req.checks]
        with self.db.tx() as s:
            sub = s.get(Submission, req.submission_id)
            if sub is None:
                raise ProtocolError(404, f"no submission {req.submission_id}")
            if sub.status == "pending":
                pass
            elif sub.status == "accepted" and not req.accepted:  # a challenge inside the window
                credits = [c for c in ledger.credits_in_window(s, sub.node_id, now) if c.submission_id == sub.id]
                if not credits:
                    raise ProtocolError(409, f"submission {sub.id}'s challenge window is closed")
            else:
                raise ProtocolError(409, f"submission {sub.id} already has a verdict ({sub.status})")
            sub.validator_id, sub.validated_at, sub.checks = p.node_id, now, checks
            reply = VerdictReply(submission_id=sub.id, status="accepted" if req.accepted else "rejected")
            node_id = sub.node_id
            if req.accepted:
                sub.status, sub.reason = "accepted", req.reason or None
                amount = self.cfg.credit_per_sample * sub.n_rows
                ledger.credit(s, sub.node_id, amount, sub.id, self.cfg.challenge_window_s, now=now)
                reply.credited = amount
            else:
                self._punish(s, sub, req, reply, now)
        self.metrics().write(event="verdict", submission_id=req.submission_id, node_id=node_id,
                             validator_id=p.node_id, status=reply.status, credited=reply.credited,
                             slashed=reply.slashed, revoked=reply.revoked, reason=req.reason[:300])
        if not req.accepted:
            log.warning("rejected submission %d from %s: %s (slashed %.1f, revoked %.1f, ejected)", req.submission_id,
                        node_id, req.reason, reply.slashed, reply.revoked)
        return reply

    def _punish(self, s, sub: Submission, req: VerdictRequest, reply: VerdictReply, now: float) -> None:  # noqa: ANN001
        """Reject: slash the stake, revoke in-window credits, eject, reject its pending work, free its tasks."""
        sub.status, sub.reason = "rejected", req.reason or "rejected by validator"
        res = ledger.slash(s, sub.node_id, self.cfg.slash_fraction, f"submission {sub.id}: {sub.reason}",
                           submission_id=sub.id, now=now)
        node = s.get(Node, sub.node_id)
        node.status, node.status_reason = "ejected", f"invalid submission {sub.id}: {sub.reason}"[:1000]
        others = s.execute(select(Submission).where(Submission.node_id == node.id,
                                                     Submission.status == "pending")).scalars().all()
        for o in others:
            o.status, o.reason, o.validated_at = "rejected", "node ejected", now
        # everything the node still held goes back to the pool for honest nodes
        held = [o.assignment_id for o in others] + [sub.assignment_id]
        s.execute(update(Assignment).where(Assignment.id.in_(held)).values(status="orphaned"))
        s.execute(update(Assignment).where(Assignment.node_id == node.id, Assignment.status == "open")
                  .values(status="orphaned"))
        self._orphans_hint = True
        reply.slashed, reply.revoked, reply.ejected = res.slashed, res.revoked, True

    # ---- trainer ---------------------------------------------------------------------------------
    def set_step(self, req: StepRequest) -> StepReply:
        with self.db.tx() as s:
            step, pv = self._state(s)
            if req.step < step or req.policy_version < pv:
                raise ProtocolError(409, f"step/policy version must not go back (now {step}/{pv})")
            s.get(State, "step").value = str(req.step)
            s.get(State, "policy_version").value = str(req.policy_version)
        return StepReply(step=req.step, policy_version=req.policy_version)

    def accepted(self, step: int) -> AcceptedList:
        statuses = ("accepted", "pending") if self.cfg.optimistic else ("accepted",)
        with self.db.tx() as s:
            subs = s.execute(select(Submission).where(Submission.step == step, Submission.status.in_(statuses))
                             .order_by(Submission.id)).scalars().all()
            return AcceptedList(step=step, optimistic=self.cfg.optimistic, items=[self._info(x) for x in subs])

    # ---- public views ----------------------------------------------------------------------------
    def balance(self, node_id: str, now: float | None = None) -> Balance:
        from swarmrl.protocol.models import LedgerEntry

        with self.db.tx() as s:
            node = s.get(Node, node_id)
            if node is None:
                raise ProtocolError(404, f"no node {node_id}")
            b = ledger.balances(s, node_id, now)
            rows = s.execute(select(LedgerEntry).where(LedgerEntry.node_id == node_id).order_by(LedgerEntry.id)
                             ).scalars().all()
            return Balance(node_id=node_id, status=node.status, stake=b.stake, credits_locked=b.credits_locked,
                           credits_unlocked=b.credits_unlocked,
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
        from sqlalchemy import func

        with self.db.tx() as s:
            step, pv = self._state(s)
            n = s.execute(select(func.count()).select_from(Node).where(Node.role == "worker",
                                                                         Node.status == "active")).scalar_one()
        return Health(ok=True, step=step, policy_version=pv, nodes_active=int(n))


# ---- HTTP layer -------------------------------------------------------------------------------------

class _BodyCap:
    """ASGI middleware: JSON requests over ``max_bytes`` get 413 before any handler reads them
    (uploads stream through and are capped by their handler)."""

    def __init__(self, app, max_bytes: int) -> None:  # noqa: ANN001
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001
        if scope["type"] != "http" or scope["path"].startswith(UPLOAD_PREFIX):
            return await self.app(scope, receive, send)
        for k, v in scope.get("headers", []):
            if k == b"content-length":
                try:
                    too_big = int(v) > self.max_bytes
                except ValueError:
                    too_big = True
                if too_big:
                    return await _send_error(send, 413, f"request body over the {self.max_bytes}-byte limit")
        chunks, size, more = [], 0, True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await _send_error(send, 413, f"request body over the {self.max_bytes}-byte limit")
            chunks.append(chunk)
            more = msg.get("more_body", False)
        body = b"".join(chunks)
        sent = False

        async def replay():  # noqa: ANN202
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _send_error(send, status: int, detail: str) -> None:  # noqa: ANN001
    data = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def _signed_path(request: Request) -> str:
    """The path as sent (percent-encoding untouched) plus the raw query: what the client signed."""
    raw = request.scope.get("raw_path")
    path = raw.decode("latin-1") if raw else request.url.path
    q = request.scope.get("query_string", b"").decode("latin-1")
    return path + (f"?{q}" if q else "")


_ERRORS = {code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 413, 422, 429)}

API_DESCRIPTION = """Orchestrator of a swarmrl run. Node, validator and trainer calls are signed with Ed25519:
headers X-Swarm-Key (public key hex), X-Swarm-Timestamp (unix s), X-Swarm-Nonce (hex, single use),
X-Swarm-Content-SHA256 (body hash) and X-Swarm-Signature over
`swarmrl-req-v1\\nMETHOD\\npath?query\\nsha256\\ntimestamp\\nnonce` (see swarmrl.protocol.signing)."""


def create_app(cfg: OrchestratorConfig, orch: Orchestrator | None = None, run_sweeper: bool = True) -> FastAPI:
    orch = orch or Orchestrator(cfg)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202
        task = None
        if run_sweeper:
            async def sweeper() -> None:
                while True:
                    await asyncio.sleep(cfg.sweep_interval_s)
                    try:
                        await run_in_threadpool(orch.sweep)
                        await run_in_threadpool(orch.maybe_write_metrics)
                    except Exception:  # keep sweeping; a DB hiccup must not kill membership
                        log.exception("sweep failed")
            task = asyncio.create_task(sweeper())
        yield
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app = FastAPI(title="swarmrl orchestrator", version="1", description=API_DESCRIPTION, lifespan=lifespan)
    app.state.orchestrator = orch
    app.add_middleware(_BodyCap, max_bytes=cfg.max_json_bytes)

    @app.exception_handler(ProtocolError)
    async def _perr(_req: Request, e: ProtocolError) -> JSONResponse:
        orch.counters["refused"] += 1
        headers = {"Retry-After": "1"} if e.status == 429 else None
        return JSONResponse({"detail": e.detail}, status_code=e.status, headers=headers)

    async def raw_body(request: Request) -> bytes:
        return await request.body()

    def signed(*roles: str, allow_unregistered: bool = False) -> Callable[..., Principal]:
        def dep(request: Request, body: bytes = Depends(raw_body)) -> Principal:
            return orch.authenticate(request.method, _signed_path(request), request.headers, body_sha256(body),
                                     roles, allow_unregistered)
        return dep

    @app.get("/v1/ping", tags=["public"])
    async def ping() -> dict[str, bool]:
        """Unsigned no-op (liveness; the benchmark's baseline)."""
        return {"ok": True}

    @app.get("/v1/health", response_model=Health, tags=["public"])
    def health() -> Health:
        return orch.health()

    @app.get("/v1/nodes/{node_id}", response_model=NodeInfo, responses=_ERRORS, tags=["public"])
    def node_info(node_id: str) -> NodeInfo:
        return orch.node_info(node_id)

    @app.get("/v1/nodes/{node_id}/ledger", response_model=Balance, responses=_ERRORS, tags=["public"])
    def node_ledger(node_id: str) -> Balance:
        return orch.balance(node_id)

    @app.post("/v1/nodes/register", response_model=RegisterReply, responses=_ERRORS, tags=["node"])
    def register(body: RegisterRequest, p: Principal = Depends(signed("worker", allow_unregistered=True))
                 ) -> RegisterReply:
        """Join with a public key, hardware description, measured throughput and a stake."""
        return orch.register(p, body)

    @app.post("/v1/nodes/heartbeat", response_model=HeartbeatReply, responses=_ERRORS, tags=["node"])
    def heartbeat(body: HeartbeatRequest, request: Request, raw: bytes = Depends(raw_body)) -> HeartbeatReply:
        """Liveness; the reply carries the node's assignments (seeded tasks, budget, weight relays)."""
        return orch.signed_heartbeat(request.method, _signed_path(request), request.headers, body_sha256(raw), body)

    @app.put(UPLOAD_PREFIX + "{assignment_id}", response_model=SubmitReply, responses=_ERRORS, tags=["node"],
             openapi_extra={"requestBody": {"required": True, "description": "the rollout parquet file; "
                                            "X-Swarm-Content-SHA256 is its sha256",
                                            "content": {"application/octet-stream": {"schema": {
                                                "type": "string", "format": "binary"}}}}})
    async def upload(assignment_id: IdParam, request: Request) -> SubmitReply:
        """Upload a rollout file for an open assignment (streamed under a byte cap, schema-checked)."""
        p = await run_in_threadpool(orch.authenticate, request.method, _signed_path(request), request.headers, None,
                                    ("worker",))
        await run_in_threadpool(orch.precheck_upload, p, assignment_id)
        try:
            cl = request.headers.get("content-length")
            if cl is not None and cl.isdigit() and int(cl) > cfg.max_upload_bytes:
                raise ProtocolError(413, f"upload of {cl} bytes is over the {cfg.max_upload_bytes}-byte limit")
            try:
                tmp, sha, size = await orch.store.receive(request.stream(), cfg.max_upload_bytes)
            except UploadTooLarge as e:
                raise ProtocolError(413, str(e)) from None
            if sha != p.content_sha256:
                orch.store.discard(tmp)
                raise ProtocolError(401, "uploaded bytes do not match the signed content hash")
            return await run_in_threadpool(orch.accept_upload, p, assignment_id, tmp, sha, size)
        except ProtocolError as e:
            if e.status in (413, 422):
                await run_in_threadpool(orch.release_assignment, p, assignment_id, e.detail)
            raise

    @app.get("/v1/submissions/{submission_id}", response_model=SubmissionDetail, responses=_ERRORS, tags=["public"])
    def submission(submission_id: IdParam) -> SubmissionDetail:
        """A submission's status and, once judged, the validator's verdict with the reason of every check."""
        return orch.submission(submission_id)

    @app.get("/v1/submissions/{submission_id}/file", responses=_ERRORS, tags=["validator", "trainer"],
             response_class=FileResponse)
    def submission_file(submission_id: IdParam, p: Principal = Depends(signed("validator", "trainer"))) -> FileResponse:
        return FileResponse(orch.submission_path(submission_id), media_type="application/octet-stream")

    @app.get("/v1/validator/pending", response_model=PendingList, responses=_ERRORS, tags=["validator"])
    def pending(limit: Annotated[int, Query(ge=1, le=256)] = 16, p: Principal = Depends(signed("validator"))) -> PendingList:
        return orch.pending(limit)

    @app.post("/v1/validator/verdicts", response_model=VerdictReply, responses=_ERRORS, tags=["validator"])
    def verdict(body: VerdictRequest, p: Principal = Depends(signed("validator"))) -> VerdictReply:
        """Accept (credit, locked for the challenge window) or reject (slash, revoke, eject). Rejecting an
        accepted submission inside its challenge window is a challenge."""
        return orch.verdict(p, body)

    @app.post("/v1/trainer/step", response_model=StepReply, responses=_ERRORS, tags=["trainer"])
    def set_step(body: StepRequest, p: Principal = Depends(signed("trainer"))) -> StepReply:
        return orch.set_step(body)

    @app.post("/v1/trainer/weights", response_model=WeightsReply, responses=_ERRORS, tags=["trainer"])
    def set_weights(body: WeightsRequest, p: Principal = Depends(signed("trainer"))) -> WeightsReply:
        """Announce the SHARDCAST servers (relays) and manifest-signing key; heartbeats hand them to nodes."""
        return orch.set_weights(body)

    @app.get("/v1/trainer/steps/{step}/submissions", response_model=AcceptedList, responses=_ERRORS,
             tags=["trainer"])
    def accepted(step: Annotated[int, PathParam(ge=0, le=MAX_ID)], p: Principal = Depends(signed("trainer"))) -> AcceptedList:
        """Accepted submissions for a step (plus pending ones when the orchestrator runs optimistic)."""
        return orch.accepted(step)

    return app


_CFG_ENV = "SWARMRL_ORCHESTRATOR_CONFIG"


def app_from_env() -> FastAPI:
    """App factory for multi-process serving: the config travels as JSON in an environment variable."""
    import os

    return create_app(OrchestratorConfig.model_validate_json(os.environ[_CFG_ENV]))


def serve(cfg: OrchestratorConfig) -> None:
    """Serve on cfg.host:cfg.port. ``workers > 1`` runs that many processes on one socket (PostgreSQL only:
    SQLite serialises writers through a lock inside one process)."""
    import os

    import uvicorn

    if cfg.workers > 1:
        if not cfg.database_url or cfg.database_url.startswith("sqlite"):
            raise ValueError("workers > 1 needs a PostgreSQL database_url (SQLite allows one writer process)")
        Orchestrator(cfg).db.dispose()  # create tables and principals once, before the workers start
        os.environ[_CFG_ENV] = cfg.model_dump_json()
        uvicorn.run("swarmrl.protocol.orchestrator:app_from_env", factory=True, host=cfg.host, port=cfg.port,
                    workers=cfg.workers, log_level="info")
    else:
        uvicorn.run(create_app(cfg), host=cfg.host, port=cfg.port, log_level="info")
