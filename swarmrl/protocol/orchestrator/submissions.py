"""Submissions: upload admission and acceptance, release of refused work, the validator's queue and
verdicts (credit, or slash + revoke + eject), and the views of submissions."""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from swarmrl.contract import AsyncWindow, GroupRule
from swarmrl.protocol import ledger
from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.db import Database
from swarmrl.protocol.models import Assignment, Node, Submission
from swarmrl.protocol.orchestrator.assigning import LIVE, family
from swarmrl.protocol.orchestrator.errors import Principal, ProtocolError
from swarmrl.protocol.orchestrator.metrics import OrchestratorMetrics
from swarmrl.protocol.schemas import (
    AcceptedList,
    AssignmentSpec,
    InlineFile,
    PendingList,
    PendingSubmission,
    SubmissionDetail,
    SubmissionInfo,
    SubmitReply,
    VerdictReply,
    VerdictRequest,
)
from swarmrl.protocol.store import ContentStore

if TYPE_CHECKING:
    from swarmrl.rollouts.wire import RolloutLimits

log = logging.getLogger("swarmrl.protocol.orchestrator")  # one logger for the whole orchestrator


def rollout_limits(cfg: OrchestratorConfig) -> RolloutLimits:
    """The limits an uploaded rollout file is read under (``OrchestratorConfig``'s upload fields)."""
    from swarmrl.rollouts.wire import RolloutLimits  # noqa: PLC0415  # lazy: pyarrow

    return RolloutLimits(max_bytes=cfg.max_upload_bytes, max_rows=cfg.max_rows, max_decoded_bytes=cfg.max_decoded_bytes,
                         max_string_bytes=cfg.max_string_bytes, max_prompt_tokens=cfg.max_prompt_tokens,
                         max_completion_tokens=cfg.max_completion_tokens, max_proofs_per_row=cfg.max_proofs_per_row,
                         max_proof_bytes=cfg.max_proof_bytes, max_footer_bytes=cfg.max_footer_bytes)


class SubmissionsMixin:
    """Uploads, verdicts and submission views, part of ``Orchestrator`` (state set up by its ``__init__``)."""

    cfg: OrchestratorConfig
    window: AsyncWindow
    db: Database
    store: ContentStore
    counters: dict[str, int]
    prom: OrchestratorMetrics
    _orphans_hint: bool
    _state: Callable[[Any], tuple[int, int]]
    _spec: Callable[[Assignment], AssignmentSpec]
    metrics: Callable[[], Any]

    def precheck_upload(self, p: Principal, assignment_id: int) -> None:
        with self.db.tx() as s:
            if self._resubmitted(s, p, assignment_id, p.content_sha256) is not None:
                return  # a retry of an upload that was stored: answered with that submission once received
            self._uploadable(s, p, assignment_id)
            self._check_duplicate(s, p, p.content_sha256)

    @staticmethod
    def _resubmitted(s, p: Principal, assignment_id: int, sha: str) -> Submission | None:  # noqa: ANN001
        """The node's own stored submission of this very file for this assignment: an upload retried because its
        reply was lost (the orchestrator stopped after the commit, the connection broke) is answered with it
        instead of a refusal."""
        sub = s.execute(select(Submission).where(Submission.assignment_id == assignment_id)).scalars().first()
        return sub if sub is not None and sub.node_id == p.node_id and sub.sha256 == sha else None

    def _uploadable(self, s, p: Principal, assignment_id: int, lock: bool = False) -> Assignment:  # noqa: ANN001
        """The assignment, if ``p`` may upload it: its holder, its row not closed, and its family (the same seeded
        work, reassigned or not) not completed by anyone's upload yet. ``lock`` locks the family's rows first
        (PostgreSQL), so two holders uploading at once cannot both complete it."""
        a = s.get(Assignment, assignment_id)
        if a is None or a.node_id != p.node_id:
            raise ProtocolError(404, f"assignment {assignment_id} is not assigned to this node")
        # ejected while its upload streamed in (admitted before): refused now. PostgreSQL: the node's row is locked,
        # so an ejection committing meanwhile either comes first (seen here) or rejects this upload as pending work
        node = s.get(Node, p.node_id, with_for_update=lock and not self.db.is_sqlite)
        if node is not None and node.status == "ejected":
            raise ProtocolError(403, f"node is ejected: {node.status_reason or 'slashed'}")
        if lock and not self.db.is_sqlite:  # SQLite: transactions are serialised already
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

    def release_assignment(self, p: Principal, assignment_id: int, reason: str) -> None:
        """Demand mode: an upload for this assignment was refused (invalid / oversized): put it back up for
        reassignment so the step is not starved by a node that cannot deliver."""
        if not self.cfg.groups_per_step:
            return
        released = False
        with self.db.tx() as s:
            a = s.get(Assignment, assignment_id)
            if a is not None and a.node_id == p.node_id and a.status == "open":
                a.status = "orphaned"
                s.info["dirty"] = {a.node_id}
                self._orphans_hint = released = True
                log.info("assignment %d released after a refused upload from %s: %s", assignment_id, p.node_id,
                         reason[:200])
        if released:
            self.changes.bump("work")  # up for another node

    @staticmethod
    def _check_duplicate(s, p: Principal, sha: str) -> None:  # noqa: ANN001
        dup = s.execute(select(Submission).where(Submission.sha256 == sha)).scalars().first()
        if dup is not None:
            who = "this node" if dup.node_id == p.node_id else "another node (replay)"
            raise ProtocolError(409, f"file {sha[:16]}... was already submitted by {who}")

    def accept_upload(self, p: Principal, assignment_id: int, tmp: Path, sha: str, size: int,
                      now: float | None = None) -> SubmitReply:
        from swarmrl.rollouts.wire import RolloutError, RolloutTooLarge, check_rollouts  # noqa: PLC0415  # lazy: pyarrow

        now = time.time() if now is None else now
        try:
            try:
                rows = check_rollouts(tmp, rollout_limits(self.cfg))  # every column checked, grouping fields kept
            except RolloutTooLarge as e:  # decoded past a limit: refused before it was materialised
                raise ProtocolError(413, f"rollout file over a limit: {e}") from None
            except RolloutError as e:
                raise ProtocolError(422, f"invalid rollout file: {e}") from None
            if not rows:
                raise ProtocolError(422, "invalid rollout file: no rows")
            with self.db.tx() as s:
                again = self._resubmitted(s, p, assignment_id, sha)
                if again is not None:
                    log.info("submission %d from %s uploaded again (a retry): answered with it", again.id,
                             p.node_id)
                    return SubmitReply(submission_id=again.id, sha256=sha, n_rows=again.n_rows, status=again.status)
                a = self._uploadable(s, p, assignment_id, lock=True)
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
                # the first upload completes the work: every other holder's copy is closed
                closed = s.execute(update(Assignment).where(*family(a), Assignment.id != a.id,
                                                            Assignment.status.in_(LIVE)).values(status="closed")
                                   .returning(Assignment.node_id).execution_options(synchronize_session=False)
                                   ).scalars().all()
                s.info["dirty"] = {p.node_id, *closed}  # their heartbeats stop listing this work
                if closed:
                    log.info("assignment %d completed by %s; %d other copies closed", a.id, p.node_id, len(closed))
                self.store.commit(tmp, sha)
                reply = SubmitReply(submission_id=sub.id, sha256=sha, n_rows=len(rows), status="pending")
        except IntegrityError:
            raise ProtocolError(409, "duplicate submission (same file or assignment)") from None
        finally:
            self.store.discard(tmp)
        self.counters["uploads"] += 1
        self.prom.submissions.labels("uploaded").inc()
        self.changes.bump("uploads")
        log.info("submission %d from %s: %d rows, %s", reply.submission_id, p.node_id, reply.n_rows, sha[:12])
        return reply

    def _usable_groups(self, rows, group_size: int) -> int:  # noqa: ANN001
        """Complete groups the trainer can use (``contract.GroupRule``, with the assignment's group size)."""
        return GroupRule(group_size, filter_ties=self.cfg.contract.filter_ties).count_usable(rows)

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
                                               current_policy_version=pv))
        return PendingList(items=items)

    def verdict(self, p: Principal, req: VerdictRequest, now: float | None = None) -> VerdictReply:
        now = time.time() if now is None else now
        checks = [c.model_dump() for c in req.checks]
        with self.db.tx() as s:
            sub = s.get(Submission, req.submission_id)
            if sub is None:
                raise ProtocolError(404, f"no submission {req.submission_id}")
            if sub.status == "pending":
                first = now - sub.created_at  # upload -> first verdict
            elif sub.status == "accepted" and not req.accepted:  # a challenge inside the window
                first = None
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
        if first is not None:
            self.prom.validation_latency.observe(max(first, 0.0))
        self.prom.submissions.labels(reply.status if first is not None else "challenged").inc()
        self.changes.bump("verdicts")
        if not req.accepted:
            self.changes.bump("work")  # the step it was for may be short again
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
        s.info.setdefault("dirty", set()).add(node.id)
        reply.slashed, reply.revoked, reply.ejected = res.slashed, res.revoked, True
        self.prom.slashes.inc()
        self.prom.stake_slashed.inc(max(res.slashed, 0.0))
        self.prom.submissions.labels("ejected").inc(len(others))

    def inline_files(self, subs: list[SubmissionInfo], n: int) -> list[InlineFile]:
        """The stored files of the first ``n`` of ``subs`` that fit the inline budget (``inline_file_bytes`` each,
        ``inline_total_bytes`` together), base64: the listing carries them instead of one download each. A file
        missing from the store is left out (its download answers 410 as before)."""
        out: list[InlineFile] = []
        left = self.cfg.inline_total_bytes
        for sub in subs[:n]:
            if sub.size > self.cfg.inline_file_bytes or sub.size > left:
                continue
            try:
                data = self.store.path_for(sub.sha256).read_bytes()
            except (OSError, ValueError):
                continue
            if len(data) != sub.size:
                continue
            left -= len(data)
            out.append(InlineFile(submission_id=sub.submission_id, data=base64.b64encode(data).decode("ascii")))
        if out:
            self.prom.file_bytes.inc(sum(len(f.data) * 3 // 4 for f in out))
        return out

    def accepted_window(self) -> AcceptedList:
        """Accepted (optimistic: and pending) submissions of the steps the trainer may still use: its current step
        and the ``open_steps`` of the window after it (``step`` of the answer is the current step)."""
        statuses = ("accepted", "pending") if self.cfg.optimistic else ("accepted",)
        with self.db.tx() as s:
            step, _ = self._state(s)
            steps = self.window.open_steps(step)
            subs = s.execute(select(Submission).where(
                Submission.step >= steps.start, Submission.step < steps.stop,
                Submission.status.in_(statuses)).order_by(Submission.id)).scalars().all()
            return AcceptedList(step=step, optimistic=self.cfg.optimistic, items=[self._info(x) for x in subs])

    def accepted(self, step: int) -> AcceptedList:
        statuses = ("accepted", "pending") if self.cfg.optimistic else ("accepted",)
        with self.db.tx() as s:
            subs = s.execute(select(Submission).where(Submission.step == step, Submission.status.in_(statuses))
                             .order_by(Submission.id)).scalars().all()
            return AcceptedList(step=step, optimistic=self.cfg.optimistic, items=[self._info(x) for x in subs])
