"""Joining and staying (``router``, over ``Membership`` and ``Assignments``): registration (rate-limited per source
address), the stake deposits of a stake authority that registration locks, and heartbeats (liveness; the reply
carries the node's assignments).

``POST /v1/nodes/heartbeat`` is answered by ``http``'s ``_FastHeartbeat`` middleware when it can (``HotPath``);
the endpoint here is the full path, reached with the signature headers that middleware verified (``VERIFIED`` in
the scope)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from swarmrl.protocol.orchestrator.errors import Principal
from swarmrl.protocol.orchestrator.routes.deps import (
    ERRORS,
    JOINS,
    MAX_CHANGES_WAIT_S,
    VERIFIED,
    AssignmentsDep,
    MembershipDep,
    raw_body,
    signed,
    signed_request,
    trusted,
)
from swarmrl.protocol.schemas import (
    DepositReply,
    DepositRequest,
    HeartbeatReply,
    HeartbeatRequest,
    RegisterReply,
    RegisterRequest,
)
from swarmrl.protocol.signing import body_sha256

router = APIRouter()


@router.post("/v1/nodes/register", response_model=RegisterReply, responses=ERRORS, tags=["node"], dependencies=JOINS)
def register(body: RegisterRequest, request: Request, members: MembershipDep,
             p: Principal = Depends(signed("worker", allow_unregistered=True))) -> RegisterReply:
    """Join with a public key, hardware description, measured throughput and a stake (at most what a stake
    authority deposited for the key). Rate-limited per source address."""
    reply = members.register(p, body)
    trusted(request)
    return reply


@router.post("/v1/ledger/deposits", response_model=DepositReply, responses=ERRORS, tags=["authority"])
def deposit(body: DepositRequest, members: MembershipDep, p: Principal = Depends(signed("authority"))) -> DepositReply:
    """A stake authority deposits stake for a node (by node id or public key, registered or not yet)."""
    return members.deposit(p, body)


@router.post("/v1/nodes/heartbeat", response_model=HeartbeatReply, responses=ERRORS, tags=["node"])
def heartbeat(body: HeartbeatRequest, request: Request, assignments: AssignmentsDep, raw: bytes = Depends(raw_body),
              wait: Annotated[float, Query(ge=0, le=MAX_CHANGES_WAIT_S)] = 0.0) -> HeartbeatReply:
    """Liveness; the reply carries the node's assignments (seeded tasks, budget, weight relays). With ``wait``,
    a reply without work is held until work may have opened or ``wait`` seconds passed (a long poll)."""
    reply = assignments.signed_heartbeat(signed_request(request, body_sha256(raw)), body,
                                         verified=request.scope.get(VERIFIED), wait=wait)
    trusted(request)
    return reply
