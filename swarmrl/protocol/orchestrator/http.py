"""The HTTP layer: ``create_app`` wraps an ``Orchestrator`` in a FastAPI app whose request/response bodies
are the pydantic models in ``schemas`` (the API is documented by its OpenAPI schema at ``/openapi.json``);
``runner.serve`` runs it under uvicorn behind the connection limits of ``guard``. With ``guard`` and ``runner``,
the only part of the orchestrator that imports fastapi, starlette or uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers

from swarmrl.dashboard import page_html
from swarmrl.dashboard.models import MAX_NODES, MAX_POINTS, NodeList, Overview, PolicyStats, TrainerCurves
from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.orchestrator.auth import RateLimiter
from swarmrl.protocol.orchestrator.errors import Principal, ProtocolError
from swarmrl.protocol.orchestrator.service import Orchestrator
from swarmrl.protocol.schemas import (
    AcceptedList,
    Balance,
    DepositReply,
    DepositRequest,
    ErrorBody,
    Health,
    HeartbeatReply,
    HeartbeatRequest,
    NodeInfo,
    PendingList,
    RegisterReply,
    RegisterRequest,
    StepReply,
    StepRequest,
    SubmissionDetail,
    SubmitReply,
    VerdictReply,
    VerdictRequest,
    WeightsReply,
    WeightsRequest,
)
from swarmrl.protocol.signing import body_sha256
from swarmrl.protocol.store import UploadTooLarge
from swarmrl.utils.serving import TRUST_EXTENSION

log = logging.getLogger("swarmrl.protocol.orchestrator")  # one logger for the whole orchestrator

UPLOAD_PREFIX = "/v1/submissions/upload/"
MAX_ID = 2**62
MAX_HAVE_CHARS = 8192  # GET /v1/trainer/accepted?have=: ~700 submission ids, far more than a window lists
MAX_CHANGES_WAIT_S = 10.0  # a long poll (pending work, accepted work) holds a server thread at most this long
IdParam = Annotated[int, PathParam(ge=1, le=MAX_ID)]


async def _read_capped(scope, receive, send, max_bytes: int) -> bytes | None:  # noqa: ANN001
    """The whole request body, or None once a 413 was sent (or the client left)."""
    for k, v in scope.get("headers", []):
        if k == b"content-length":
            try:
                too_big = int(v) > max_bytes
            except ValueError:
                too_big = True
            if too_big:
                await _send_error(send, 413, f"request body over the {max_bytes}-byte limit")
                return None
    chunks, size, more = [], 0, True
    while more:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return None
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            await _send_error(send, 413, f"request body over the {max_bytes}-byte limit")
            return None
        chunks.append(chunk)
        more = msg.get("more_body", False)
    return b"".join(chunks)


def _replay(body: bytes, receive):  # noqa: ANN001, ANN202
    sent = False

    async def replay():  # noqa: ANN202
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replay


class _BodyCap:
    """ASGI middleware: JSON requests over ``max_bytes`` get 413 before any handler reads them
    (uploads stream through and are capped by their handler)."""

    def __init__(self, app, max_bytes: int) -> None:  # noqa: ANN001
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001
        if scope["type"] != "http" or scope["path"].startswith(UPLOAD_PREFIX) or VERIFIED in scope:
            return await self.app(scope, receive, send)
        body = await _read_capped(scope, receive, send, self.max_bytes)
        if body is not None:
            await self.app(scope, _replay(body, receive), send)


async def _send_error(send, status: int, detail: str, retry_after: float | None = None) -> None:  # noqa: ANN001
    data = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if retry_after is not None:
        headers.append((b"retry-after", str(max(1, math.ceil(retry_after))).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


HEARTBEAT_PATH = "/v1/nodes/heartbeat"
VERIFIED = "swarmrl.verified"  # scope key: the signature headers the hot path checked already


class _FastHeartbeat:
    """ASGI middleware, outermost: ``POST /v1/nodes/heartbeat`` goes to ``Orchestrator.fast_heartbeat`` first
    (no routing, no thread hop; the reply waits for its group commit). What it cannot answer goes on to the
    FastAPI route with the verified headers, at most ``max_full`` at once (beyond: 503 + Retry-After)."""

    def __init__(self, app, orch: Orchestrator, max_bytes: int, max_full: int) -> None:  # noqa: ANN001
        self.app, self.orch, self.max_bytes, self.max_full = app, orch, max_bytes, max_full
        self.full = 0

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001
        if scope["type"] != "http" or scope["path"] != HEARTBEAT_PATH or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        body = await _read_capped(scope, receive, send, self.max_bytes)
        if body is None:
            return
        try:
            h, done, reply = self.orch.fast_heartbeat("POST", _scope_signed_path(scope), Headers(scope=scope), body,
                                                      may_wait=b"wait=" in scope.get("query_string", b""))
            if done is not None:
                try:
                    fresh = await asyncio.wrap_future(done)
                except Exception:  # the database failed: the node did nothing wrong
                    raise ProtocolError(503, "the orchestrator could not record this heartbeat; retry",
                                        retry_after=1) from None
                if not fresh:
                    raise ProtocolError(401, "replayed nonce")
        except ProtocolError as e:
            self.orch.counters["refused"] += 1
            self.orch.prom.refused.labels(str(e.status)).inc()
            return await _send_error(send, e.status, e.detail, (e.retry_after or 1) if e.status in (429, 503) else None)
        if done is None:  # the full path
            if self.full >= self.max_full:
                self.orch.counters["refused"] += 1
                self.orch.prom.refused.labels("503").inc()
                return await _send_error(send, 503, f"{self.full} heartbeats in progress; retry later", 1)
            self.full += 1
            try:
                return await self.app({**scope, VERIFIED: h}, _replay(body, receive), send)
            finally:
                self.full -= 1
        mark = (scope.get("extensions") or {}).get(TRUST_EXTENSION)
        if mark is not None:
            mark()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(reply)).encode())]})
        await send({"type": "http.response.body", "body": reply})


def _scope_signed_path(scope) -> str:  # noqa: ANN001
    """The path as sent (percent-encoding untouched) plus the raw query: what the client signed."""
    raw = scope.get("raw_path")
    path = raw.decode("latin-1") if raw else scope["path"]
    q = scope.get("query_string", b"").decode("latin-1")
    return path + (f"?{q}" if q else "")


def _json_safe(v):  # noqa: ANN001, ANN202
    """``v`` with every non-finite float replaced by its name ("nan", "inf", "-inf")."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_json_safe(x) for x in v]
    return v


def per_address(limiter: RateLimiter, what: str) -> Callable[[Request], Any]:
    """A dependency spending one token of the client address's bucket: 429 with ``Retry-After`` when empty (the
    address is the TCP peer; uvicorn replaces it by X-Forwarded-For only for proxies it trusts)."""
    async def dep(request: Request) -> None:
        host = request.client.host if request.client else "?"
        wait = limiter.take(host)
        if wait:
            raise ProtocolError(429, f"{what} rate limit exceeded for {host}", retry_after=wait)
    return dep


def _signed_path(request: Request) -> str:
    return _scope_signed_path(request.scope)


def _trusted(request: Request) -> None:
    """The request was authenticated: its source address may use the connections reserved for trusted ones."""
    mark = (request.scope.get("extensions") or {}).get(TRUST_EXTENSION)
    if mark is not None:
        mark()


_ERRORS = {code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 413, 422, 429)}

API_DESCRIPTION = """Orchestrator of a swarmrl run. Node, validator and trainer calls are signed with Ed25519:
headers X-Swarm-Key (public key hex), X-Swarm-Timestamp (unix s), X-Swarm-Nonce (hex, single use),
X-Swarm-Content-SHA256 (body hash) and X-Swarm-Signature over
`swarmrl-req-v1\\nMETHOD\\npath?query\\nsha256\\ntimestamp\\nnonce` (see swarmrl.protocol.signing)."""


def create_app(cfg: OrchestratorConfig, orch: Orchestrator | None = None, run_sweeper: bool = True) -> FastAPI:
    orch = orch or Orchestrator(cfg)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202
        task = None
        if run_sweeper:
            async def sweeper() -> None:
                while True:
                    await asyncio.sleep(cfg.sweep_interval_s)
                    try:
                        await run_in_threadpool(orch.sweep)
                        await run_in_threadpool(orch.maybe_write_metrics)
                    except Exception:  # keep sweeping; a DB hiccup must not kill membership
                        log.exception("sweep failed")
            task = asyncio.create_task(sweeper())
        yield
        await run_in_threadpool(orch.beat_writer.close)  # commits what it holds
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app = FastAPI(title="swarmrl orchestrator", version="1", description=API_DESCRIPTION, lifespan=lifespan)
    app.state.orchestrator = orch
    app.add_middleware(_BodyCap, max_bytes=cfg.max_json_bytes)
    app.add_middleware(_FastHeartbeat, orch=orch, max_bytes=cfg.max_json_bytes, max_full=cfg.max_full_heartbeats)

    @app.exception_handler(ProtocolError)
    async def _perr(req: Request, e: ProtocolError) -> JSONResponse:
        orch.counters["refused"] += 1
        orch.prom.refused.labels(str(e.status)).inc()
        if req.url.path.startswith(UPLOAD_PREFIX):
            orch.prom.submissions.labels("refused").inc()
        # 429/503 always say when to come back; another refusal only when it may pass later (a stake not yet deposited)
        later = e.status in (429, 503) or e.retry_after is not None
        headers = {"Retry-After": str(max(1, math.ceil(e.retry_after or 1)))} if later else None
        return JSONResponse({"detail": e.detail}, status_code=e.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req: Request, e: RequestValidationError) -> JSONResponse:
        """422 with pydantic's reasons; a NaN or Infinity they quote (the input refused) is quoted as a string,
        so the reply is valid JSON instead of a 500."""
        return JSONResponse({"detail": _json_safe(jsonable_encoder(e.errors()))}, status_code=422)

    # per source address, separate from the per-key limiter of signed requests: joining (each registration is a
    # new key, so the per-key limiter cannot see a flood of them) and the unsigned public views
    joins = [Depends(per_address(RateLimiter(cfg.register_rate_per_s, cfg.register_burst), "registration"))]
    public = [Depends(per_address(RateLimiter(cfg.public_rate_per_s, cfg.public_burst), "public API"))]

    async def raw_body(request: Request) -> bytes:
        return await request.body()

    def signed(*roles: str, allow_unregistered: bool = False) -> Callable[..., Principal]:
        def dep(request: Request, body: bytes = Depends(raw_body)) -> Principal:
            p = orch.authenticate(request.method, _signed_path(request), request.headers, body_sha256(body),
                                  roles, allow_unregistered)
            if not allow_unregistered:  # registration vouches for an address only once it succeeds
                _trusted(request)
            return p
        return dep

    @app.get("/v1/ping", tags=["public"])
    async def ping() -> dict[str, bool]:
        """Unsigned no-op (liveness; the benchmark's baseline)."""
        return {"ok": True}

    @app.get("/metrics", response_class=Response, tags=["public"], dependencies=public,
             responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}, 429: {"model": ErrorBody}})
    def metrics() -> Response:
        """Prometheus metrics (text format): counters of this process, and gauges of the database read by one
        query at most every few seconds. Rate-limited per address like the other public views."""
        return Response(orch.prom.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/health", response_model=Health, responses=_ERRORS, tags=["public"], dependencies=public)
    def health() -> Health:
        return orch.health()

    @app.get("/v1/nodes/{node_id}", response_model=NodeInfo, responses=_ERRORS, tags=["public"], dependencies=public)
    def node_info(node_id: str) -> NodeInfo:
        return orch.node_info(node_id)

    @app.get("/v1/nodes/{node_id}/ledger", response_model=Balance, responses=_ERRORS, tags=["public"],
             dependencies=public)
    def node_ledger(node_id: str) -> Balance:
        return orch.balance(node_id)

    @app.get("/dashboard", response_class=HTMLResponse, tags=["public"], dependencies=public,
             responses={429: {"model": ErrorBody}})
    def dashboard() -> HTMLResponse:
        """The live dashboard (one self-contained HTML page polling ``/v1/stats/...``; see docs/dashboard.md)."""
        return HTMLResponse(page_html(), headers={"Cache-Control": "no-store"})

    @app.get("/v1/stats/overview", response_model=Overview, responses=_ERRORS, tags=["stats"], dependencies=public)
    def stats_overview() -> Overview:
        """Step, policy version, worker nodes by status, the validation queue and verdict counts."""
        return orch.stats_overview()

    @app.get("/v1/stats/nodes", response_model=NodeList, responses=_ERRORS, tags=["stats"], dependencies=public)
    def stats_nodes(limit: Annotated[int, Query(ge=1, le=MAX_NODES)] = MAX_NODES) -> NodeList:
        """Worker nodes (at most ``limit``, active first, then by throughput) with stake, credits, verdicts,
        slashes and the policy version of their latest assignment; ``total`` counts them all."""
        return orch.stats_nodes(limit)

    @app.get("/v1/stats/trainer", response_model=TrainerCurves, responses=_ERRORS, tags=["stats"],
             dependencies=public)
    def stats_trainer(limit: Annotated[int, Query(ge=1, le=MAX_POINTS)] = 500) -> TrainerCurves:
        """The trainer's newest ``limit`` policy-version records (loss, reward, held-out accuracy), as it posts
        them with its step."""
        return orch.stats_trainer(limit)

    @app.get("/v1/stats/policy", response_model=PolicyStats, responses=_ERRORS, tags=["stats"], dependencies=public)
    def stats_policy() -> PolicyStats:
        """The current policy version, the SHARDCAST servers announced to nodes and the nodes per version."""
        return orch.stats_policy()

    @app.post("/v1/nodes/register", response_model=RegisterReply, responses=_ERRORS, tags=["node"], dependencies=joins)
    def register(body: RegisterRequest, request: Request,
                 p: Principal = Depends(signed("worker", allow_unregistered=True))) -> RegisterReply:
        """Join with a public key, hardware description, measured throughput and a stake (at most what a stake
        authority deposited for the key). Rate-limited per source address."""
        reply = orch.register(p, body)
        _trusted(request)
        return reply

    @app.post("/v1/ledger/deposits", response_model=DepositReply, responses=_ERRORS, tags=["authority"])
    def deposit(body: DepositRequest, p: Principal = Depends(signed("authority"))) -> DepositReply:
        """A stake authority deposits stake for a node (by node id or public key, registered or not yet)."""
        return orch.deposit(p, body)

    @app.post("/v1/nodes/heartbeat", response_model=HeartbeatReply, responses=_ERRORS, tags=["node"])
    def heartbeat(body: HeartbeatRequest, request: Request, raw: bytes = Depends(raw_body),
                  wait: Annotated[float, Query(ge=0, le=MAX_CHANGES_WAIT_S)] = 0.0) -> HeartbeatReply:
        """Liveness; the reply carries the node's assignments (seeded tasks, budget, weight relays). With ``wait``,
        a reply without work is held until work may have opened or ``wait`` seconds passed (a long poll)."""
        reply = orch.signed_heartbeat(request.method, _signed_path(request), request.headers, body_sha256(raw), body,
                                      verified=request.scope.get(VERIFIED), wait=wait)
        _trusted(request)
        return reply

    @app.put(UPLOAD_PREFIX + "{assignment_id}", response_model=SubmitReply, responses=_ERRORS, tags=["node"],
             openapi_extra={"requestBody": {"required": True, "description": "the rollout parquet file; "
                                            "X-Swarm-Content-SHA256 is its sha256",
                                            "content": {"application/octet-stream": {"schema": {
                                                "type": "string", "format": "binary"}}}}})
    async def upload(assignment_id: IdParam, request: Request) -> SubmitReply:
        """Upload a rollout file for an open assignment (streamed under a byte cap, schema-checked)."""
        p = await run_in_threadpool(orch.authenticate, request.method, _signed_path(request), request.headers, None,
                                    ("worker",))
        _trusted(request)
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

    @app.get("/v1/submissions/{submission_id}", response_model=SubmissionDetail, responses=_ERRORS, tags=["public"],
             dependencies=public)
    def submission(submission_id: IdParam) -> SubmissionDetail:
        """A submission's status and, once judged, the validator's verdict with the reason of every check."""
        return orch.submission(submission_id)

    @app.get("/v1/submissions/{submission_id}/file", responses=_ERRORS, tags=["validator", "trainer"],
             response_class=FileResponse)
    def submission_file(submission_id: IdParam, p: Principal = Depends(signed("validator", "trainer"))) -> FileResponse:
        path = orch.submission_path(submission_id)
        orch.prom.file_bytes.inc(path.stat().st_size)
        return FileResponse(path, media_type="application/octet-stream")

    @app.get("/v1/validator/pending", response_model=PendingList, responses=_ERRORS, tags=["validator"])
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

    @app.post("/v1/validator/verdicts", response_model=VerdictReply, responses=_ERRORS, tags=["validator"])
    def verdict(body: VerdictRequest, p: Principal = Depends(signed("validator"))) -> VerdictReply:
        """Accept (credit, locked for the challenge window) or reject (slash, revoke, eject). Rejecting an
        accepted submission inside its challenge window is a challenge."""
        return orch.verdict(p, body)

    @app.post("/v1/trainer/step", response_model=StepReply, responses=_ERRORS, tags=["trainer"])
    def set_step(body: StepRequest, p: Principal = Depends(signed("trainer"))) -> StepReply:
        return orch.set_step(body)

    @app.post("/v1/trainer/weights", response_model=WeightsReply, responses=_ERRORS, tags=["trainer"])
    def set_weights(body: WeightsRequest, p: Principal = Depends(signed("trainer"))) -> WeightsReply:
        """Announce the SHARDCAST servers (relays) and manifest-signing key; heartbeats hand them to nodes."""
        return orch.set_weights(body)

    @app.get("/v1/trainer/accepted", response_model=AcceptedList, responses=_ERRORS, tags=["trainer"])
    def accepted_window(since: Annotated[int, Query(ge=-1, le=MAX_ID)] = -1,
                        wait: Annotated[float, Query(ge=0, le=MAX_CHANGES_WAIT_S)] = 0.0,
                        inline: Annotated[int, Query(ge=0, le=256)] = 0,
                        have: Annotated[str, Query(max_length=MAX_HAVE_CHARS, pattern=r"^([0-9]{1,19}(,[0-9]{1,19})*)?$")] = "",
                        p: Principal = Depends(signed("trainer"))) -> AcceptedList:
        """Accepted submissions of the trainer's current step and the async window after it, once the verdict
        counter (optimistic: the upload counter) is no longer ``since`` or after ``wait`` seconds (a long poll;
        ``changes`` in the answer is the counter to pass next). With ``inline=N``, ``files`` carries the files of
        up to N listed submissions whose ids are not in ``have`` (comma-separated: the ones the trainer holds)."""
        kind = "uploads" if orch.cfg.optimistic else "verdicts"
        orch.changes.wait(kind, since, wait)
        seen = orch.changes.generation(kind)  # before listing
        got = orch.accepted_window()
        got.changes = seen
        if inline and got.items:
            held = {int(x) for x in have.split(",") if x}
            got.files = orch.inline_files([it for it in got.items if it.submission_id not in held], inline)
        return got

    @app.get("/v1/trainer/steps/{step}/submissions", response_model=AcceptedList, responses=_ERRORS,
             tags=["trainer"])
    def accepted(step: Annotated[int, PathParam(ge=0, le=MAX_ID)], p: Principal = Depends(signed("trainer"))) -> AcceptedList:
        """Accepted submissions for a step (plus pending ones when the orchestrator runs optimistic)."""
        return orch.accepted(step)

    return app

