"""Verdicts' bookkeeping: a validator's accept credits the work (``ledger``, locked for the challenge window); a
reject (or a challenge of accepted work inside that window) slashes the stake, revokes the node's credits still
in their window, ejects the node, rejects its pending work and puts everything it held back up (``orphans``)."""

from __future__ import annotations

import logging
import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from swarmrl.protocol.db import Database
from swarmrl.protocol.orchestrator.changes import Changes
from swarmrl.protocol.orchestrator.errors import Principal, ProtocolError
from swarmrl.protocol.orchestrator.ledger import Ledger
from swarmrl.protocol.orchestrator.orphans import Orphans
from swarmrl.protocol.orchestrator.telemetry import Telemetry
from swarmrl.protocol.schemas import VerdictReply, VerdictRequest
from swarmrl.protocol.tables import Node, Submission

log = logging.getLogger("swarmrl.protocol.orchestrator")  # one logger for the whole orchestrator


class Verdicts:
    """A validator's verdicts: the submission's state, the ``Ledger``'s credit or slash, the ejection, and the
    work ``Orphans`` puts back up, in one transaction; then the metrics file, Prometheus and the long polls."""

    def __init__(self, db: Database, ledger: Ledger, orphans: Orphans, changes: Changes, telemetry: Telemetry) -> None:
        self._db = db
        self._ledger = ledger
        self._orphans = orphans
        self._changes = changes
        self._telemetry = telemetry

    def verdict(self, p: Principal, req: VerdictRequest, now: float | None = None) -> VerdictReply:
        """Record validator ``p``'s verdict on a pending submission, or its challenge of an accepted one whose
        credit is still in its window (409 otherwise)."""
        now = time.time() if now is None else now
        with self._db.tx() as s:
            sub = s.get(Submission, req.submission_id)
            if sub is None:
                raise ProtocolError(404, f"no submission {req.submission_id}")
            if sub.status == "pending":
                first = now - sub.created_at  # upload -> first verdict
            elif sub.status == "accepted" and not req.accepted:  # a challenge inside the window
                first = None
                if not self._ledger.credited_in_window(s, sub.node_id, sub.id, now):
                    raise ProtocolError(409, f"submission {sub.id}'s challenge window is closed")
            else:
                raise ProtocolError(409, f"submission {sub.id} already has a verdict ({sub.status})")
            sub.validator_id, sub.validated_at, sub.checks = p.node_id, now, [c.model_dump() for c in req.checks]
            reply = VerdictReply(submission_id=sub.id, status="accepted" if req.accepted else "rejected")
            node_id = sub.node_id
            if req.accepted:
                sub.status, sub.reason = "accepted", req.reason or None
                reply.credited = self._ledger.credit(s, sub.node_id, sub.id, sub.n_rows, now)
            else:
                self._punish(s, sub, req, reply, now)
        self._telemetry.write(event="verdict", submission_id=req.submission_id, node_id=node_id,
                              validator_id=p.node_id, status=reply.status, credited=reply.credited,
                              slashed=reply.slashed, revoked=reply.revoked, reason=req.reason[:300])
        prom = self._telemetry.prom
        if first is not None:
            prom.validation_latency.observe(max(first, 0.0))
        prom.submissions.labels(reply.status if first is not None else "challenged").inc()
        self._changes.bump("verdicts")
        if not req.accepted:
            self._changes.bump("work")  # the step it was for may be short again
            log.warning("rejected submission %d from %s: %s (slashed %.1f, revoked %.1f, ejected)", req.submission_id,
                        node_id, req.reason, reply.slashed, reply.revoked)
        return reply

    def _punish(self, s: Session, sub: Submission, req: VerdictRequest, reply: VerdictReply, now: float) -> None:
        """Reject: slash the stake, revoke in-window credits, eject, reject its pending work, free its tasks."""
        sub.status, sub.reason = "rejected", req.reason or "rejected by validator"
        res = self._ledger.slash(s, sub.node_id, f"submission {sub.id}: {sub.reason}", sub.id, now)
        self.eject(s, sub.node_id, f"invalid submission {sub.id}: {sub.reason}", now, [sub.assignment_id])
        reply.slashed, reply.revoked, reply.ejected = res.slashed, res.revoked, True
        self._telemetry.prom.stake_slashed.inc(max(res.slashed, 0.0))

    def eject(self, s: Session, node_id: str, reason: str, now: float, rows: list[int] | None = None) -> int:
        """Eject the node (inside ``s``): its status, its pending work rejected, everything it held (and the
        assignment ``rows`` given) back up for honest nodes; counted as a slash. Returns the pending submissions
        rejected."""
        node = s.get(Node, node_id)
        node.status, node.status_reason = "ejected", reason[:1000]
        others = s.execute(select(Submission).where(Submission.node_id == node.id,
                                                     Submission.status == "pending")).scalars().all()
        for o in others:
            o.status, o.reason, o.validated_at = "rejected", "node ejected", now
        self._orphans.rows(s, [o.assignment_id for o in others] + list(rows or []))
        self._orphans.of_nodes(s, [node.id])
        prom = self._telemetry.prom
        prom.slashes.inc()
        prom.submissions.labels("ejected").inc(len(others))
        return len(others)
