"""The heartbeat hot path (one server process): a node whose work at the current step is assigned already and has
nothing to take over is answered from ``heartbeat_cache.Mirror`` (built by its last full heartbeat,
``Assignments``), its nonce and liveness committed in a batch by ``heartbeat_cache.BeatWriter`` before the reply.
Any other state goes to the full path (``Assignments.signed_heartbeat``), in one transaction."""

from __future__ import annotations

import time
from concurrent.futures import Future

from sqlalchemy import Float, String, bindparam, column, select, update, values
from sqlalchemy.exc import IntegrityError

from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.db import Database
from swarmrl.protocol.orchestrator.assignments import Assignments
from swarmrl.protocol.orchestrator.auth import Auth, SignedRequest
from swarmrl.protocol.orchestrator.errors import ProtocolError
from swarmrl.protocol.orchestrator.heartbeat_cache import Beat, BeatWriter, HotNode, Mirror, Overloaded
from swarmrl.protocol.orchestrator.orphans import Orphans
from swarmrl.protocol.orchestrator.run_state import RunState
from swarmrl.protocol.orchestrator.telemetry import Telemetry
from swarmrl.protocol.schemas import HeartbeatRequest
from swarmrl.protocol.signing import SignedHeaders
from swarmrl.protocol.tables import Assignment, Node, Nonce


class HotPath:
    """Answers steady-state heartbeats from memory. ``enabled`` only with ``fast_heartbeats`` and one server
    process (another process could change what the mirror holds)."""

    def __init__(self, cfg: OrchestratorConfig, db: Database, run: RunState, auth: Auth, orphans: Orphans,
                 assignments: Assignments, mirror: Mirror, telemetry: Telemetry) -> None:
        self._cfg = cfg
        self._db = db
        self._run = run
        self._auth = auth
        self._orphans = orphans
        self._assignments = assignments
        self._mirror = mirror
        self._telemetry = telemetry
        self.enabled = cfg.fast_heartbeats and cfg.workers == 1
        self.beat_writer = BeatWriter(self._write_beats, cfg.max_heartbeat_queue)

    def close(self) -> None:
        """Commit what the writer holds and stop its thread."""
        self.beat_writer.close()

    def load_mirror(self) -> int:
        """Mirror every active worker whose heartbeat needs no write but its own (at start-up: a restarted
        orchestrator answers its known nodes from memory at once). Returns how many were mirrored."""
        demand = self._cfg.groups_per_step > 0
        step, _pv = self._run.cached
        lo = self._run.useful_from(step)
        epoch = self._mirror.generation("")[0]
        with self._db.tx() as s:
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
            if ready and self._mirror.install(nid, (epoch, self._mirror.generation(nid)[1]),
                                              HotNode(pk, last, step, None, rows=[a for a in mine if a.status == "open"])):
                n += 1
        return n

    def answer(self, call: SignedRequest, body: bytes, now: float | None = None, may_wait: bool = False
               ) -> tuple[SignedHeaders, Future | None, bytes]:
        """A heartbeat answered from memory when the node's state allows: returns the verified headers, a future
        completed once the beat's writes are committed (then send the reply bytes), or None when the full path must
        answer (pass it the verified headers). Raises ``ProtocolError`` for a refusal, with the same reasons the
        full path gives. ``call.body_sha256`` is the hash of ``body``. ``may_wait``: the request asks to wait for
        work (``?wait=``), which only the full path does, so a node without work goes there."""
        now = time.time() if now is None else now
        h = self._auth.verify(call, now)  # 401 / 429 before anything else
        self._auth.pace_heartbeat(h, now)  # the full path is handed these headers and does not pace them again
        hot = self._mirror.nodes.get(h.node_id)
        step, pv = self._run.cached
        if hot is None or not self.enabled or hot.public_key != h.public_key or \
                not self._answerable(hot, step, now, may_wait):
            return h, None, b""
        try:
            HeartbeatRequest.model_validate_json(body)
        except ValueError:
            return h, None, b""  # the full path answers with the validation errors
        expires = self._auth.remember_nonce(h)
        key = (step, pv, self._run.weights)
        if hot.specs is None:  # mirrored at start-up: the assignments' tasks are derived on first use
            hot.specs, hot.rows = [self._assignments.spec(a) for a in hot.rows], []
        if hot.reply_key != key:
            hot.reply = self._assignments.reply(h.node_id, step, pv, hot.specs).model_dump_json().encode()
            hot.reply_key = key
        try:
            fut = self.beat_writer.submit(Beat(h.node_id, h.public_key, h.nonce, expires, now))
        except Overloaded as e:
            raise ProtocolError(503, f"orchestrator overloaded: {e}; retry later", retry_after=1) from None
        self._telemetry.heartbeat()
        return h, fut, hot.reply

    def _answerable(self, hot: HotNode, step: int, now: float, may_wait: bool) -> bool:
        """Whether the mirrored answer is still the answer at ``step`` (else the full path makes or looks for
        work)."""
        cfg = self._cfg
        demand = cfg.groups_per_step > 0
        if hot.step != step or (demand and not (hot.specs or hot.rows)):
            return False  # a new assignment to make (or to look for)
        if not demand and cfg.reassign_per_heartbeat and self._orphans.waiting:
            return False  # orphaned work may be waiting for a taker
        if demand and cfg.idle_after_missed and now - hot.last_heartbeat > cfg.heartbeat_interval_s * cfg.idle_after_missed:
            return False  # its open work was (or is about to be) put back up
        return not (may_wait and not (hot.specs or hot.rows))  # no work to hand it: the full path waits for some

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
                self._mirror.touch(b.node_id, b.now)
        return ok

    def _write_beats_tx(self, beats: list[Beat], chunk: int = 1000) -> None:
        last: dict[str, float] = {}
        for b in beats:
            last[b.node_id] = max(last.get(b.node_id, 0.0), b.now)
        seen = sorted(last.items())  # one lock order for concurrent writers (PostgreSQL)
        nodes = Node.__table__
        rows = [{"public_key": b.public_key, "nonce": b.nonce, "expires_at": b.expires_at} for b in beats]
        with self._db.tx() as s:
            if self._db.is_sqlite:  # in-process: executemany is a C loop
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
