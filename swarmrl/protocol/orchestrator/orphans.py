"""Orphaned work: assignments put back up for another node (their holder died, fell silent, timed out, had its
upload refused, declined it, or was ejected), the rows a taker may get, and the hint that lets a heartbeat skip
looking.

Reassigned work: the rows with one ``(origin_node_id, step, round)`` (so one seed) are one piece of work, a
*family* (``family``): the original holder's row and one row per node that took it over. At most one row of a
family is ``open`` or ``orphaned`` at a time (taking an orphan marks it ``reassigned``); any holder whose row is
``LIVE`` may still upload it, the first upload completes the family (``Submissions.accept_upload`` closes the
other rows) and the others get one 409.

Declined work (``decline``): a holder that cannot serve an open assignment puts it back up at once, and the work's
family is never handed to that node again (``not_declined_by``: neither by taking over another row of it nor by
re-opening its own row when it comes back from the dead or from silence)."""

from __future__ import annotations

import logging

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.orm import Session

from swarmrl.protocol.db import Database
from swarmrl.protocol.orchestrator.run_state import RunState
from swarmrl.protocol.tables import Assignment, Decline, Node

log = logging.getLogger("swarmrl.protocol.orchestrator")  # one logger for the whole orchestrator

LIVE = ("open", "orphaned", "reassigned")  # rows of a family whose holder may still upload them


def family(a: Assignment) -> tuple:
    """Where-clauses selecting every row of ``a``'s family (the same seeded work, whoever holds it)."""
    return (Assignment.origin_node_id == a.origin_node_id, Assignment.step == a.step,
            Assignment.round == (a.round or 0))


def not_declined_by(node_id: str) -> ColumnElement[bool]:
    """Where-clause on ``Assignment``: ``node_id`` did not decline the row's family (the same seeded work)."""
    return ~select(Decline.assignment_id).where(
        Decline.node_id == node_id, Decline.origin_node_id == Assignment.origin_node_id,
        Decline.step == Assignment.step, Decline.round == Assignment.round).correlate(Assignment).exists()


def dirty(s: Session, *node_ids: str) -> None:
    """Name nodes whose heartbeat answer this transaction changes (``Mirror.after_commit`` drops them)."""
    s.info.setdefault("dirty", set()).update(node_ids)


class Orphans:
    """Puts work back up and finds it for takers. ``waiting`` is False only after a query found no orphaned work
    and nothing was orphaned since (this process is the only writer of assignment states while the hot path is
    on; a sweep looks again every interval, bounding any missed update)."""

    def __init__(self, db: Database, run: RunState) -> None:
        self._db = db
        self._run = run
        with db.tx() as s:
            self.waiting = self.recheck(s)

    def recheck(self, s: Session) -> bool:
        """Look whether orphaned work still of use exists (what a taker could get); sets and returns ``waiting``."""
        step, _ = self._run.read(s)
        self.waiting = s.execute(select(Assignment.id).where(
            Assignment.status == "orphaned", Assignment.step >= self._run.useful_from(step)).limit(1)).first() is not None
        return self.waiting

    def of_nodes(self, s: Session, node_ids: list[str]) -> None:
        """The open work of these nodes (dead, or ejected) goes back up."""
        if node_ids:
            s.execute(update(Assignment).where(Assignment.node_id.in_(node_ids), Assignment.status == "open")
                      .values(status="orphaned"))
            dirty(s, *node_ids)
            self.waiting = True

    def rows(self, s: Session, ids: list[int]) -> None:
        """These assignments go back up, whatever their state (the work of an ejected node's submissions)."""
        s.execute(update(Assignment).where(Assignment.id.in_(ids)).values(status="orphaned"))
        self.waiting = True

    def of_silent_nodes(self, s: Session, last_heartbeat_before: float) -> list[str]:
        """Demand mode: the open work of workers silent since ``last_heartbeat_before`` goes back up (an idle sybil,
        a stalled node); returns its holders."""
        idle = select(Node.id).where(Node.role == "worker", Node.last_heartbeat < last_heartbeat_before)
        return self._orphan_open(s, Assignment.node_id.in_(idle))

    def expired(self, s: Session, created_before: float) -> list[str]:
        """Open work handed out before ``created_before`` goes back up; returns its holders."""
        return self._orphan_open(s, Assignment.created_at < created_before)

    def release(self, s: Session, a: Assignment) -> None:
        """An open assignment goes back up (its upload was refused as invalid or oversized, or it was declined)."""
        a.status = "orphaned"
        dirty(s, a.node_id)
        self.waiting = True

    def decline(self, s: Session, a: Assignment, reason: str, now: float) -> None:
        """Its holder declined the open assignment ``a``: it goes back up (same seed) and the refusal is recorded,
        so the work is never handed back to that node (``not_declined_by``)."""
        self.release(s, a)
        s.add(Decline(assignment_id=a.id, node_id=a.node_id, origin_node_id=a.origin_node_id, step=a.step,
                      round=a.round or 0, reason=reason, created_at=now))

    def for_taker(self, s: Session, node_id: str, lo: int, limit: int, lock: bool) -> list[Assignment]:
        """Up to ``limit`` orphaned rows of steps >= ``lo`` held by others than ``node_id``, of work it did not
        decline (``lock``: row-locked, skipping rows another taker holds). Clears ``waiting`` when nothing at all is
        orphaned (the node's own orphans, and work it declined, do not count as none)."""
        q = (select(Assignment).where(Assignment.status == "orphaned", Assignment.step >= lo,
                                      Assignment.node_id != node_id, not_declined_by(node_id))
             .order_by(Assignment.id).limit(limit))
        if lock:
            q = q.with_for_update(skip_locked=True)
        found = list(s.execute(q).scalars().all())
        if not found and s.execute(select(Assignment.id).where(Assignment.status == "orphaned", Assignment.step >= lo)
                                   .limit(1)).first() is None:
            self.waiting = False
        return found

    def _orphan_open(self, s: Session, where: ColumnElement[bool]) -> list[str]:
        holders = list(s.execute(update(Assignment).where(Assignment.status == "open", where)
                                 .values(status="orphaned").returning(Assignment.node_id)
                                 .execution_options(synchronize_session=False)).scalars().all())
        if holders:
            dirty(s, *holders)
            self.waiting = True
        return holders
