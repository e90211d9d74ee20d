"""Submissions (``router``, over ``Submissions``): a node uploads a rollout file for an open assignment (streamed
under a byte cap) or declines one it cannot serve, anyone reads a submission's status and verdict, the validator and the trainer download its
file."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from swarmrl.protocol.orchestrator.errors import Principal, ProtocolError
from swarmrl.protocol.orchestrator.routes.deps import (
    ERRORS,
    PUBLIC,
    UPLOAD_PREFIX,
    AssignmentsDep,
    AuthDep,
    IdParam,
    SubmissionsDep,
    signed,
    signed_request,
    trusted,
)
from swarmrl.protocol.schemas import DeclineReply, DeclineRequest, HeartbeatRequest, SubmissionDetail, SubmitReply

_UPLOAD_BODY = {"requestBody": {"required": True, "description": "the rollout parquet file; "
                                "X-Swarm-Content-SHA256 is its sha256",
                                "content": {"application/octet-stream": {"schema": {
                                    "type": "string", "format": "binary"}}}}}

router = APIRouter()


@router.put(UPLOAD_PREFIX + "{assignment_id}", response_model=SubmitReply, responses=ERRORS, tags=["node"],
            openapi_extra=_UPLOAD_BODY)
async def upload(assignment_id: IdParam, request: Request, auth: AuthDep, subs: SubmissionsDep,
                 assignments: AssignmentsDep) -> SubmitReply:
    """Upload a rollout file for an open assignment (streamed under a byte cap, schema-checked)."""
    p = await run_in_threadpool(auth.authenticate, signed_request(request, None), ("worker",))
    trusted(request)
    await run_in_threadpool(subs.precheck_upload, p, assignment_id)
    try:
        tmp, sha, size = await subs.receive(p, request.stream(), request.headers.get("content-length"))
        rep = await run_in_threadpool(subs.accept_upload, p, assignment_id, tmp, sha, size)
    except ProtocolError as e:
        if e.status in (413, 422):
            await run_in_threadpool(subs.release_assignment, p, assignment_id, e.detail)
        raise
    if request.query_params.get("next") == "1":  # the node's heartbeat, answered with the upload
        try:
            rep.next = await run_in_threadpool(assignments.heartbeat, p, HeartbeatRequest())
        except ProtocolError:  # it hears why at its next heartbeat; the upload itself stands
            rep.next = None
    return rep


@router.post("/v1/assignments/{assignment_id}/decline", response_model=DeclineReply, responses=ERRORS, tags=["node"])
def decline(assignment_id: IdParam, body: DeclineRequest, subs: SubmissionsDep,
            p: Principal = Depends(signed("worker"))) -> DeclineReply:
    """Decline an open assignment this node cannot serve: it goes back up at once for other nodes (same seed) and
    is never handed back to this one. No penalty. 404 unknown, 403 another node's, 409 not open."""
    return subs.decline(p, assignment_id, body.reason)


@router.get("/v1/submissions/{submission_id}", response_model=SubmissionDetail, responses=ERRORS, tags=["public"],
            dependencies=PUBLIC)
def submission(submission_id: IdParam, subs: SubmissionsDep) -> SubmissionDetail:
    """A submission's status and, once judged, the validator's verdict with the reason of every check."""
    return subs.submission(submission_id)


@router.get("/v1/submissions/{submission_id}/file", responses=ERRORS, tags=["validator", "trainer"],
            response_class=FileResponse)
def submission_file(submission_id: IdParam, subs: SubmissionsDep,
                    p: Principal = Depends(signed("validator", "trainer"))) -> FileResponse:
    return FileResponse(subs.serve_file(submission_id), media_type="application/octet-stream")
