"""Submissions: upload admission (who may upload what), reception (streamed under the byte cap, hashed) and
acceptance (read under ``RolloutLimits``, stored by hash, the work's family completed), the release of refused
work and of work its holder declines, and what validators and the trainer read of submissions: a submission's
record and file, the pending queue and the accepted lists (long polls, with files inline). Verdicts are
``verdicts.Verdicts``."""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from swarmrl.contract import GroupRule
from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.content_store import ContentStore, UploadTooLarge
from swarmrl.protocol.db import Database
from swarmrl.protocol.orchestrator.assignments import Assignments
from swarmrl.protocol.orchestrator.changes import Changes
from swarmrl.protocol.orchestrator.errors import Principal, ProtocolError
from swarmrl.protocol.orchestrator.orphans import LIVE, Orphans, dirty, family
from swarmrl.protocol.orchestrator.run_state import RunState
from swarmrl.protocol.orchestrator.telemetry import Telemetry
from swarmrl.protocol.schemas import (
    AcceptedList,
    DeclineReply,
    InlineFile,
    PendingList,
    PendingSubmission,
    SubmissionDetail,
    SubmissionInfo,
    SubmitReply,
)
from swarmrl.protocol.tables import Assignment, Decline, Node, Submission

if TYPE_CHECKING:
    from swarmrl.rollouts.wire import GroupKey

log = logging.getLogger("swarmrl.protocol.orchestrator")  # one logger for the whole orchestrator


_NOT_OPEN = {  # why a row that is not open cannot be declined
    "submitted": "it was uploaded",
    "closed": "another holder's upload completed it",
    "reassigned": "it was taken over by another node",
    "orphaned": "it is up for reassignment already (timed out, or its holder fell silent)",
}


def submission_info(sub: Submission) -> SubmissionInfo:
    return SubmissionInfo(submission_id=sub.id, node_id=sub.node_id, assignment_id=sub.assignment_id, step=sub.step,
                          sha256=sub.sha256, size=sub.size, n_rows=sub.n_rows, status=sub.status,
                          reason=sub.reason, created_at=sub.created_at, informative=sub.informative or 0)


class Submissions:
    """Uploads and what is read of submissions. Uses ``Assignments.spec`` to show a pending submission's
    assignment, ``Orphans`` to put refused work back up, ``RunState`` for the window the trainer may use."""

    def __init__(self, cfg: OrchestratorConfig, db: Database, store: ContentStore, run: RunState,
                 assignments: Assignments, orphans: Orphans, changes: Changes, telemetry: Telemetry) -> None:
        self._cfg = cfg
        self._db = db
        self._store = store
        self._run = run
        self._assignments = assignments
        self._orphans = orphans
        self._changes = changes
        self._telemetry = telemetry

    # ---- uploads -----------------------------------------------------------------------------------------
    def precheck_upload(self, p: Principal, assignment_id: int) -> None:
        """Before the body is read: may ``p`` upload this assignment, and is the signed file new?"""
        with self._db.tx() as s:
            if self._resubmitted(s, p, assignment_id, p.content_sha256) is not None:
                return  # a retry of an upload that was stored: answered with that submission once received
            self._uploadable(s, p, assignment_id)
            self._check_duplicate(s, p, p.content_sha256)

    async def receive(self, p: Principal, chunks: AsyncIterator[bytes], content_length: str | None = None
                      ) -> tuple[Path, str, int]:
        """Stream an admitted upload's body to a temp file under ``rollout_limits.max_bytes`` (413 beyond, also
        when ``content_length`` says so at once), hashed: (temp path, sha256, size). 401 unless it is the file
        ``p`` signed."""
        cap = self._cfg.rollout_limits.max_bytes
        if content_length is not None and content_length.isdigit() and int(content_length) > cap:
            raise ProtocolError(413, f"upload of {content_length} bytes is over the {cap}-byte limit")
        try:
            tmp, sha, size = await self._store.receive(chunks, cap)
        except UploadTooLarge as e:
            raise ProtocolError(413, str(e)) from None
        self._telemetry.prom.upload_bytes.inc(size)
        if sha != p.content_sha256:
            self._store.discard(tmp)
            raise ProtocolError(401, "uploaded bytes do not match the signed content hash")
        return tmp, sha, size

    def accept_upload(self, p: Principal, assignment_id: int, tmp: Path, sha: str, size: int,
                      now: float | None = None) -> SubmitReply:
        """Check the received file (413 over a limit, 422 malformed), then store it as a pending submission that
        completes the assignment's family; the temp file is gone either way."""
        from swarmrl.rollouts.wire import RolloutError, RolloutTooLarge, check_rollouts  # noqa: PLC0415  # lazy: pyarrow

        now = time.time() if now is None else now
        try:
            try:
                rows = check_rollouts(tmp, self._cfg.rollout_limits)  # every column checked, grouping fields kept
            except RolloutTooLarge as e:  # decoded past a limit: refused before it was materialised
                raise ProtocolError(413, f"rollout file over a limit: {e}") from None
            except RolloutError as e:
                raise ProtocolError(422, f"invalid rollout file: {e}") from None
            if not rows:
                raise ProtocolError(422, "invalid rollout file: no rows")
            with self._db.tx() as s:
                again = self._resubmitted(s, p, assignment_id, sha)
                if again is not None:
                    log.info("submission %d from %s uploaded again (a retry): answered with it", again.id,
                             p.node_id)
                    return SubmitReply(submission_id=again.id, sha256=sha, n_rows=again.n_rows, status=again.status)
                reply = self._store_upload(s, p, assignment_id, rows, tmp, sha, size, now)
        except IntegrityError:
            raise ProtocolError(409, "duplicate submission (same file or assignment)") from None
        finally:
            self._store.discard(tmp)
        self._telemetry.uploaded()
        self._changes.bump("uploads")
        log.info("submission %d from %s: %d rows, %s", reply.submission_id, p.node_id, reply.n_rows, sha[:12])
        return reply

    def _store_upload(self, s: Session, p: Principal, assignment_id: int, rows: list[GroupKey], tmp: Path, sha: str,
                      size: int, now: float) -> SubmitReply:
        a = self._uploadable(s, p, assignment_id, lock=True)
        bad = next((r for r in rows if r.worker_id != p.node_id or r.step != a.step), None)
        if bad is not None:
            raise ProtocolError(422, f"rows must carry worker_id={p.node_id} and step={a.step} "
                                     f"(got {bad.worker_id!r}, {bad.step})")
        self._check_duplicate(s, p, sha)
        usable = GroupRule(a.group_size, filter_ties=self._cfg.contract.filter_ties).count_usable(rows)
        sub = Submission(assignment_id=a.id, node_id=p.node_id, step=a.step, sha256=sha, size=size,
                         n_rows=len(rows), informative=usable, status="pending", checks=[], created_at=now)
        s.add(sub)
        s.flush()
        a.status = "submitted"
        # the first upload completes the work: every other holder's copy is closed
        closed = s.execute(update(Assignment).where(*family(a), Assignment.id != a.id, Assignment.status.in_(LIVE))
                           .values(status="closed").returning(Assignment.node_id)
                           .execution_options(synchronize_session=False)).scalars().all()
        dirty(s, p.node_id, *closed)  # their heartbeats stop listing this work
        if closed:
            log.info("assignment %d completed by %s; %d other copies closed", a.id, p.node_id, len(closed))
        self._store.commit(tmp, sha)
        return SubmitReply(submission_id=sub.id, sha256=sha, n_rows=len(rows), status="pending")

    @staticmethod
    def _resubmitted(s: Session, p: Principal, assignment_id: int, sha: str) -> Submission | None:
        """The node's own stored submission of this very file for this assignment: an upload retried because its
        reply was lost (the orchestrator stopped after the commit, the connection broke) is answered with it
        instead of a refusal."""
        sub = s.execute(select(Submission).where(Submission.assignment_id == assignment_id)).scalars().first()
        return sub if sub is not None and sub.node_id == p.node_id and sub.sha256 == sha else None

    def _uploadable(self, s: Session, p: Principal, assignment_id: int, lock: bool = False) -> Assignment:
        """The assignment, if ``p`` may upload it: its holder, its row not closed, and its family (the same seeded
        work, reassigned or not) not completed by anyone's upload yet. ``lock`` locks the family's rows first
        (PostgreSQL), so two holders uploading at once cannot both complete it."""
        a = s.get(Assignment, assignment_id)
        if a is None or a.node_id != p.node_id:
            raise ProtocolError(404, f"assignment {assignment_id} is not assigned to this node")
        # ejected while its upload streamed in (admitted before): refused now. PostgreSQL: the node's row is locked,
        # so an ejection committing meanwhile either comes first (seen here) or rejects this upload as pending work
        node = s.get(Node, p.node_id, with_for_update=lock and not self._db.is_sqlite)
        if node is not None and node.status == "ejected":
            raise ProtocolError(403, f"node is ejected: {node.status_reason or 'slashed'}")
        if lock and not self._db.is_sqlite:  # SQLite: transactions are serialised already
            s.execute(select(Assignment.id).where(*family(a)).order_by(Assignment.id).with_for_update()).all()
            s.refresh(a)
        if a.status in LIVE:
            done = s.execute(select(Submission).join(Assignment, Submission.assignment_id == Assignment.id).where(
                *family(a), Submission.status.in_(("pending", "accepted")))).scalars().first()
            if done is None:
                return a
            raise ProtocolError(409, f"assignment {assignment_id} was completed by submission {done.id} of "
                                     f"{'this node' if done.node_id == p.node_id else 'another holder'}; "
                                     "this copy is closed")
        if a.status == "closed":
            raise ProtocolError(409, f"assignment {assignment_id} is closed: another holder's upload completed it")
        raise ProtocolError(409, f"assignment {assignment_id} is {a.status}, not open")

    @staticmethod
    def _check_duplicate(s: Session, p: Principal, sha: str) -> None:
        dup = s.execute(select(Submission).where(Submission.sha256 == sha)).scalars().first()
        if dup is not None:
            who = "this node" if dup.node_id == p.node_id else "another node (replay)"
            raise ProtocolError(409, f"file {sha[:16]}... was already submitted by {who}")

    def release_assignment(self, p: Principal, assignment_id: int, reason: str) -> None:
        """Demand mode: an upload for this assignment was refused (invalid / oversized): put it back up for
        reassignment so the step is not starved by a node that cannot deliver."""
        if not self._cfg.groups_per_step:
            return
        released = False
        with self._db.tx() as s:
            a = s.get(Assignment, assignment_id)
            if a is not None and a.node_id == p.node_id and a.status == "open":
                self._orphans.release(s, a)
                released = True
                log.info("assignment %d released after a refused upload from %s: %s", assignment_id, p.node_id,
                         reason[:200])
        if released:
            self._changes.bump("work")  # up for another node

    def decline(self, p: Principal, assignment_id: int, reason: str, now: float | None = None) -> DeclineReply:
        """The holder of an open assignment cannot serve it (its policy version is unavailable, the task
        environment cannot be built, ...) and says so instead of holding it until ``assignment_timeout_s``: it goes
        back up at once through the orphan queue (same seed, so still verifiable), to be taken by another node's
        heartbeat, and the work is never handed back to this node (``Orphans.decline``). Declining is no fault: no
        stake, ledger or verdict changes.

        Both assignment modes put it up. In demand mode (``groups_per_step > 0``) the node then holds no open work,
        so its next heartbeat gets other work (another node's orphan, or a new round with its own seed). Outside
        demand mode a node gets one assignment per step, and the open work of a node that cannot do it (a dead one)
        is already put up for the others (``reassign_per_heartbeat``): declined work is treated the same, and the
        node's row for the step (orphaned, then reassigned) keeps its heartbeats from listing it again or making it
        a new one for that step.

        404: no such assignment; 403: another node's; 409: not open (declined already, uploaded, completed by
        another holder, taken over, or put back up already)."""
        now = time.time() if now is None else now
        with self._db.tx() as s:
            a = s.get(Assignment, assignment_id, with_for_update=not self._db.is_sqlite)
            if a is None:
                raise ProtocolError(404, f"no assignment {assignment_id}")
            if a.node_id != p.node_id:
                raise ProtocolError(403, f"assignment {assignment_id} is not assigned to this node: only its holder "
                                         "may decline it")
            if s.get(Decline, assignment_id) is not None:
                raise ProtocolError(409, f"assignment {assignment_id} was declined already")
            if a.status != "open":
                raise ProtocolError(409, f"assignment {assignment_id} is {a.status}, not open: "
                                         f"{_NOT_OPEN.get(a.status, 'nothing to decline')}")
            self._orphans.decline(s, a, reason, now)
            status = a.status
        self._telemetry.declined()
        self._changes.bump("work")  # up for another node: held long polls of idle nodes wake up
        log.info("assignment %d declined by %s: %s", assignment_id, p.node_id, reason[:200])
        return DeclineReply(assignment_id=assignment_id, status=status)

    # ---- what validators and the trainer read ----------------------------------------------------------------
    def submission_path(self, submission_id: int) -> Path:
        """The stored file of a submission (404 unknown, 410 missing from the store)."""
        with self._db.tx() as s:
            sub = s.get(Submission, submission_id)
            if sub is None:
                raise ProtocolError(404, f"no submission {submission_id}")
            path = self._store.path_for(sub.sha256)
        if not path.is_file():
            raise ProtocolError(410, f"file of submission {submission_id} is missing from the store")
        return path

    def serve_file(self, submission_id: int) -> Path:
        """``submission_path``, counted as bytes served (``GET /v1/submissions/{id}/file``)."""
        path = self.submission_path(submission_id)
        self._telemetry.prom.file_bytes.inc(path.stat().st_size)
        return path

    def submission(self, submission_id: int) -> SubmissionDetail:
        with self._db.tx() as s:
            sub = s.get(Submission, submission_id)
            if sub is None:
                raise ProtocolError(404, f"no submission {submission_id}")
            return SubmissionDetail(**submission_info(sub).model_dump(), checks=sub.checks or [],
                                    validator_id=sub.validator_id, validated_at=sub.validated_at)

    def pending(self, limit: int) -> PendingList:
        with self._db.tx() as s:
            step, pv = self._run.read(s)
            subs = s.execute(select(Submission).where(Submission.status == "pending").order_by(Submission.id)
                             .limit(limit)).scalars().all()
            items = []
            for sub in subs:
                a = s.get(Assignment, sub.assignment_id)
                items.append(PendingSubmission(submission=submission_info(sub), assignment=self._assignments.spec(a),
                                               origin_node_id=a.origin_node_id, current_step=step,
                                               current_policy_version=pv))
        return PendingList(items=items)

    def wait_pending(self, limit: int, wait: float = 0.0, inline: int = 0) -> PendingList:
        """``pending``; with ``wait``, an empty list is answered only once an upload came or ``wait`` seconds
        passed (a long poll); with ``inline=N``, ``files`` carries the files of the first N listed."""
        seen = self._changes.generation("uploads")  # before listing: an upload after the listing ends the wait
        got = self.pending(limit)
        if not got.items and wait and self._changes.wait("uploads", seen, wait) != seen:
            got = self.pending(limit)
        if inline and got.items:
            got.files = self.inline_files([it.submission for it in got.items], inline)
        return got

    def inline_files(self, subs: list[SubmissionInfo], n: int) -> list[InlineFile]:
        """The stored files of the first ``n`` of ``subs`` that fit the inline budget (``inline_file_bytes`` each,
        ``inline_total_bytes`` together), base64: the listing carries them instead of one download each. A file
        missing from the store is left out (its download answers 410 as before)."""
        out: list[InlineFile] = []
        left = self._cfg.inline_total_bytes
        for sub in subs[:n]:
            if sub.size > self._cfg.inline_file_bytes or sub.size > left:
                continue
            try:
                data = self._store.path_for(sub.sha256).read_bytes()
            except (OSError, ValueError):
                continue
            if len(data) != sub.size:
                continue
            left -= len(data)
            out.append(InlineFile(submission_id=sub.submission_id, data=base64.b64encode(data).decode("ascii")))
        if out:
            self._telemetry.prom.file_bytes.inc(sum(len(f.data) * 3 // 4 for f in out))
        return out

    def accepted_window(self) -> AcceptedList:
        """Accepted (optimistic: and pending) submissions of the steps the trainer may still use: its current step
        and the ``open_steps`` of the window after it (``step`` of the answer is the current step)."""
        with self._db.tx() as s:
            step, _ = self._run.read(s)
            steps = self._run.window.open_steps(step)
            subs = s.execute(select(Submission).where(
                Submission.step >= steps.start, Submission.step < steps.stop,
                Submission.status.in_(self._usable_statuses())).order_by(Submission.id)).scalars().all()
            return AcceptedList(step=step, optimistic=self._cfg.optimistic, items=[submission_info(x) for x in subs])

    def wait_accepted(self, since: int = -1, wait: float = 0.0, inline: int = 0, have: frozenset[int] = frozenset()
                      ) -> AcceptedList:
        """``accepted_window`` once the verdict counter (optimistic: the upload counter) is no longer ``since`` or
        after ``wait`` seconds (a long poll; ``changes`` in the answer is the counter to pass next). With
        ``inline=N``, ``files`` carries the files of up to N listed submissions not in ``have``."""
        kind = "uploads" if self._cfg.optimistic else "verdicts"
        self._changes.wait(kind, since, wait)
        seen = self._changes.generation(kind)  # before listing
        got = self.accepted_window()
        got.changes = seen
        if inline and got.items:
            got.files = self.inline_files([it for it in got.items if it.submission_id not in have], inline)
        return got

    def accepted(self, step: int) -> AcceptedList:
        """Accepted submissions for a step (plus pending ones when the orchestrator runs optimistic)."""
        with self._db.tx() as s:
            subs = s.execute(select(Submission).where(Submission.step == step,
                                                      Submission.status.in_(self._usable_statuses()))
                             .order_by(Submission.id)).scalars().all()
            return AcceptedList(step=step, optimistic=self._cfg.optimistic, items=[submission_info(x) for x in subs])

    def _usable_statuses(self) -> tuple[str, ...]:
        return ("accepted", "pending") if self._cfg.optimistic else ("accepted",)
