"""Submissions: a node uploads a rollout file for an open assignment (streamed under a byte cap), anyone reads
a submission's status and verdict, the validator and the trainer download its file."""

from __future__ import annotations

from fastapi import Depends, FastAPI, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from swarmrl.protocol.orchestrator.errors import Principal, ProtocolError
from swarmrl.protocol.orchestrator.routes.deps import ERRORS, UPLOAD_PREFIX, IdParam, RouteDeps, signed_path, trusted
from swarmrl.protocol.schemas import HeartbeatRequest, SubmissionDetail, SubmitReply
from swarmrl.protocol.store import UploadTooLarge

_UPLOAD_BODY = {"requestBody": {"required": True, "description": "the rollout parquet file; "
                                "X-Swarm-Content-SHA256 is its sha256",
                                "content": {"application/octet-stream": {"schema": {
                                    "type": "string", "format": "binary"}}}}}


def add_routes(app: FastAPI, api: RouteDeps) -> None:
    """Upload, status and file of a submission, on ``app``."""
    orch, cfg = api.orch, api.cfg

    @app.put(UPLOAD_PREFIX + "{assignment_id}", response_model=SubmitReply, responses=ERRORS, tags=["node"],
             openapi_extra=_UPLOAD_BODY)
    async def upload(assignment_id: IdParam, request: Request) -> SubmitReply:
        """Upload a rollout file for an open assignment (streamed under a byte cap, schema-checked)."""
        p = await run_in_threadpool(orch.authenticate, request.method, signed_path(request), request.headers, None,
                                    ("worker",))
        trusted(request)
        await run_in_threadpool(orch.precheck_upload, p, assignment_id)
        try:
            cl = request.headers.get("content-length")
            if cl is not None and cl.isdigit() and int(cl) > cfg.max_upload_bytes:
                raise ProtocolError(413, f"upload of {cl} bytes is over the {cfg.max_upload_bytes}-byte limit")
            try:
                tmp, sha, size = await orch.store.receive(request.stream(), cfg.max_upload_bytes)
            except UploadTooLarge as e:
                raise ProtocolError(413, str(e)) from None
            orch.prom.upload_bytes.inc(size)
            if sha != p.content_sha256:
                orch.store.discard(tmp)
                raise ProtocolError(401, "uploaded bytes do not match the signed content hash")
            rep = await run_in_threadpool(orch.accept_upload, p, assignment_id, tmp, sha, size)
        except ProtocolError as e:
            if e.status in (413, 422):
                await run_in_threadpool(orch.release_assignment, p, assignment_id, e.detail)
            raise
        if request.query_params.get("next") == "1":  # the node's heartbeat, answered with the upload
            try:
                rep.next = await run_in_threadpool(orch.heartbeat, p, HeartbeatRequest())
            except ProtocolError:  # it hears why at its next heartbeat; the upload itself stands
                rep.next = None
        return rep

    @app.get("/v1/submissions/{submission_id}", response_model=SubmissionDetail, responses=ERRORS, tags=["public"],
             dependencies=api.public)
    def submission(submission_id: IdParam) -> SubmissionDetail:
        """A submission's status and, once judged, the validator's verdict with the reason of every check."""
        return orch.submission(submission_id)

    @app.get("/v1/submissions/{submission_id}/file", responses=ERRORS, tags=["validator", "trainer"],
             response_class=FileResponse)
    def submission_file(submission_id: IdParam,
                        p: Principal = Depends(api.signed("validator", "trainer"))) -> FileResponse:
        path = orch.submission_path(submission_id)
        orch.prom.file_bytes.inc(path.stat().st_size)
        return FileResponse(path, media_type="application/octet-stream")

