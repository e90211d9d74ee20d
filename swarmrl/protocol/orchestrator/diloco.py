"""DiLoCo rounds' bookkeeping: a DiLoCo aggregator (a validator principal, ``swarmrl.diloco.trust``) reports each
round's judgements; in one transaction every accepted node is credited (``Ledger.credit_round``, locked for the
challenge window like a rollout's credit) and every rejected node slashed (``Ledger.slash``, its in-window credits
revoked) and ejected with its work freed (``Verdicts.eject``). One ``DilocoJudgement`` row per (run, round, node)
makes a retried report change nothing."""

from __future__ import annotations

import logging
import time

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from swarmrl.protocol.db import Database
from swarmrl.protocol.orchestrator.changes import Changes
from swarmrl.protocol.orchestrator.errors import Principal, ProtocolError
from swarmrl.protocol.orchestrator.ledger import Ledger
from swarmrl.protocol.orchestrator.telemetry import Telemetry
from swarmrl.protocol.orchestrator.verdicts import Verdicts
from swarmrl.protocol.schemas import DilocoOutcome, DilocoRoundReply, DilocoRoundRequest
from swarmrl.protocol.tables import DilocoJudgement, Node

log = logging.getLogger("swarmrl.protocol.orchestrator")  # one logger for the whole orchestrator


def _outcome(j: DilocoJudgement, again: bool) -> DilocoOutcome:
    return DilocoOutcome(node_id=j.node_id, accepted=j.accepted, credited=j.credited, slashed=j.slashed,
                         revoked=j.revoked, ejected=j.ejected, again=again)


class DilocoRounds:
    """``report``: a validator's judgements of one DiLoCo round (``POST /v1/validator/diloco/rounds``)."""

    def __init__(self, db: Database, ledger: Ledger, verdicts: Verdicts, changes: Changes,
                 telemetry: Telemetry) -> None:
        self._db = db
        self._ledger = ledger
        self._verdicts = verdicts
        self._changes = changes
        self._telemetry = telemetry

    def report(self, p: Principal, req: DilocoRoundRequest, now: float | None = None) -> DilocoRoundReply:
        """Credit the accepted, slash and eject the rejected, once per (run, round, node); 422 (nothing done) if a
        named node is not a registered worker."""
        if p.role != "validator":
            raise ProtocolError(403, "only a validator key may report DiLoCo rounds")
        now = time.time() if now is None else now
        for attempt in range(2):  # a concurrent identical report: the second attempt sees its rows
            try:
                with self._db.tx() as s:
                    outcomes = self._apply(s, p, req, now)
                break
            except IntegrityError:
                if attempt:
                    raise ProtocolError(409, "DiLoCo round report raced another one; retry") from None
        fresh = [o for o in outcomes if not o.again]
        for o in fresh:
            self._telemetry.write(event="diloco_judgement", run_id=req.run_id, round=req.round, node_id=o.node_id,
                                  validator_id=p.node_id, accepted=o.accepted, credited=o.credited,
                                  slashed=o.slashed, revoked=o.revoked)
        if any(not o.accepted for o in fresh):
            self._changes.bump("work")  # an ejected node's work is up for others
            for r in req.rejected:
                log.warning("DiLoCo run %s round %d: node %s rejected (%s): slashed and ejected", req.run_id,
                            req.round, r.node_id, r.reason)
        return DilocoRoundReply(run_id=req.run_id, round=req.round, outcomes=outcomes)

    def _apply(self, s: Session, p: Principal, req: DilocoRoundRequest, now: float) -> list[DilocoOutcome]:
        named = req.accepted + [r.node_id for r in req.rejected]
        nodes = {n.id: n for n in s.execute(select(Node).where(Node.id.in_(named))).scalars()}
        bad = [nid for nid in named if nid not in nodes or nodes[nid].role != "worker"]
        if bad:
            raise ProtocolError(422, f"not registered workers: {', '.join(bad[:8])}")
        done = {j.node_id: j for j in s.execute(select(DilocoJudgement).where(
            DilocoJudgement.run_id == req.run_id, DilocoJudgement.round == req.round,
            DilocoJudgement.node_id.in_(named))).scalars()}
        where = f"DiLoCo run {req.run_id} round {req.round}"
        out = []
        for nid in req.accepted:
            if nid in done:
                out.append(_outcome(done[nid], True))
                continue
            credited = 0.0
            if nodes[nid].status != "ejected":  # ejected meanwhile (another validator): no credit
                credited = self._ledger.credit_round(s, nid, f"{where}: accepted pseudo-gradient", now)
            j = DilocoJudgement(run_id=req.run_id, round=req.round, node_id=nid, validator_id=p.node_id,
                                accepted=True, reason="", credited=credited, slashed=0.0, revoked=0.0,
                                ejected=False, created_at=now)
            s.add(j)
            out.append(_outcome(j, False))
        for r in req.rejected:
            if r.node_id in done:
                out.append(_outcome(done[r.node_id], True))
                continue
            res = self._ledger.slash(s, r.node_id, f"{where}: {r.reason}", None, now)
            self._verdicts.eject(s, r.node_id, f"{where}: hostile pseudo-gradient: {r.reason}", now)
            j = DilocoJudgement(run_id=req.run_id, round=req.round, node_id=r.node_id, validator_id=p.node_id,
                                accepted=False, reason=r.reason, credited=0.0, slashed=res.slashed,
                                revoked=res.revoked, ejected=True, created_at=now)
            s.add(j)
            self._telemetry.prom.stake_slashed.inc(max(res.slashed, 0.0))
            out.append(_outcome(j, False))
        s.flush()
        return out
