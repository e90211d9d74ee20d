"""The validator's routes (``router``, over ``Submissions``, ``Verdicts`` and ``DilocoRounds``): the pending
submissions (a long poll, optionally with files inline), verdicts, and DiLoCo aggregators' round reports."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from swarmrl.protocol.orchestrator.errors import Principal
from swarmrl.protocol.orchestrator.routes.deps import (
    ERRORS,
    MAX_CHANGES_WAIT_S,
    DilocoDep,
    SubmissionsDep,
    VerdictsDep,
    signed,
)
from swarmrl.protocol.schemas import (
    DilocoRoundReply,
    DilocoRoundRequest,
    PendingList,
    VerdictReply,
    VerdictRequest,
)

router = APIRouter()


@router.get("/v1/validator/pending", response_model=PendingList, responses=ERRORS, tags=["validator"])
def pending(subs: SubmissionsDep, limit: Annotated[int, Query(ge=1, le=256)] = 16,
            wait: Annotated[float, Query(ge=0, le=MAX_CHANGES_WAIT_S)] = 0.0,
            inline: Annotated[int, Query(ge=0, le=256)] = 0,
            p: Principal = Depends(signed("validator"))) -> PendingList:
    """Pending submissions; with ``wait``, an empty list is answered only once an upload came or ``wait``
    seconds passed (a long poll); with ``inline=N``, ``files`` carries the files of the first N listed (within
    the orchestrator's inline budget; the others are downloaded)."""
    return subs.wait_pending(limit, wait, inline)


@router.post("/v1/validator/verdicts", response_model=VerdictReply, responses=ERRORS, tags=["validator"])
def verdict(body: VerdictRequest, verdicts: VerdictsDep, p: Principal = Depends(signed("validator"))) -> VerdictReply:
    """Accept (credit, locked for the challenge window) or reject (slash, revoke, eject). Rejecting an
    accepted submission inside its challenge window is a challenge."""
    return verdicts.verdict(p, body)


@router.post("/v1/validator/diloco/rounds", response_model=DilocoRoundReply, responses=ERRORS, tags=["validator"])
def diloco_round(body: DilocoRoundRequest, diloco: DilocoDep,
                 p: Principal = Depends(signed("validator"))) -> DilocoRoundReply:
    """A DiLoCo aggregator's judgements of one round: each accepted node credited (locked for the challenge
    window), each rejected node slashed and ejected, in one transaction; once per (run, round, node), so a retried
    report changes nothing (its outcomes say ``again``)."""
    return diloco.report(p, body)
