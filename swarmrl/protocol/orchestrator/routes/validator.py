"""The validator's routes: the pending submissions (a long poll, optionally with files inline) and verdicts."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, FastAPI, Query

from swarmrl.protocol.orchestrator.errors import Principal
from swarmrl.protocol.orchestrator.routes.deps import ERRORS, MAX_CHANGES_WAIT_S, RouteDeps
from swarmrl.protocol.schemas import PendingList, VerdictReply, VerdictRequest


def add_routes(app: FastAPI, api: RouteDeps) -> None:
    """The validator's pending list and verdicts, on ``app``."""
    orch, signed = api.orch, api.signed

    @app.get("/v1/validator/pending", response_model=PendingList, responses=ERRORS, tags=["validator"])
    def pending(limit: Annotated[int, Query(ge=1, le=256)] = 16,
                wait: Annotated[float, Query(ge=0, le=MAX_CHANGES_WAIT_S)] = 0.0,
                inline: Annotated[int, Query(ge=0, le=256)] = 0,
                p: Principal = Depends(signed("validator"))) -> PendingList:
        """Pending submissions; with ``wait``, an empty list is answered only once an upload came or ``wait``
        seconds passed (a long poll); with ``inline=N``, ``files`` carries the files of the first N listed (within
        the orchestrator's inline budget; the others are downloaded)."""
        seen = orch.changes.generation("uploads")  # before listing: an upload after the listing ends the wait
        got = orch.pending(limit)
        if not got.items and wait and orch.changes.wait("uploads", seen, wait) != seen:
            got = orch.pending(limit)
        if inline and got.items:
            got.files = orch.inline_files([it.submission for it in got.items], inline)
        return got

    @app.post("/v1/validator/verdicts", response_model=VerdictReply, responses=ERRORS, tags=["validator"])
    def verdict(body: VerdictRequest, p: Principal = Depends(signed("validator"))) -> VerdictReply:
        """Accept (credit, locked for the challenge window) or reject (slash, revoke, eject). Rejecting an
        accepted submission inside its challenge window is a challenge."""
        return orch.verdict(p, body)

