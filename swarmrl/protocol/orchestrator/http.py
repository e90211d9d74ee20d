"""The HTTP layer: ``create_app`` puts an ``Orchestrator`` (its services) in a FastAPI app's state and includes the
routers of ``routes`` (one per group of callers; each endpoint gets its service through a dependency), whose
request/response bodies are the pydantic models in ``schemas`` (the API is documented by its OpenAPI schema at
``/openapi.json``); ``runner.serve`` runs it under uvicorn behind the connection limits of ``guard``. This module
holds the ASGI middleware (the JSON body cap, the fast heartbeat path: ``HotPath``), the error handlers and the
lifespan (the sweeper). With ``routes``, ``guard`` and ``runner``, the only part of the orchestrator that imports
fastapi, starlette or uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers

from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.orchestrator.auth import SignedRequest
from swarmrl.protocol.orchestrator.errors import ProtocolError
from swarmrl.protocol.orchestrator.hot_path import HotPath
from swarmrl.protocol.orchestrator.routes import membership, public, submissions, trainer, validator
from swarmrl.protocol.orchestrator.routes.deps import (  # noqa: F401  (MAX_ID, IdParam: re-exported by the package)
    MAX_ID,
    UPLOAD_PREFIX,
    VERIFIED,
    AddressLimits,
    IdParam,
    scope_signed_path,
)
from swarmrl.protocol.orchestrator.service import Orchestrator
from swarmrl.protocol.orchestrator.telemetry import Telemetry
from swarmrl.protocol.signing import body_sha256
from swarmrl.utils.serving import TRUST_EXTENSION

log = logging.getLogger("swarmrl.protocol.orchestrator")  # one logger for the whole orchestrator


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


class _FastHeartbeat:
    """ASGI middleware, outermost: ``POST /v1/nodes/heartbeat`` goes to ``HotPath.answer`` first (no routing, no
    thread hop; the reply waits for its group commit). What it cannot answer goes on to the FastAPI route with the
    verified headers, at most ``max_full`` at once (beyond: 503 + Retry-After)."""

    def __init__(self, app, hot_path: HotPath, telemetry: Telemetry, max_bytes: int, max_full: int) -> None:  # noqa: ANN001
        self.app, self.hot_path, self.telemetry = app, hot_path, telemetry
        self.max_bytes, self.max_full = max_bytes, max_full
        self.full = 0

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001
        if scope["type"] != "http" or scope["path"] != HEARTBEAT_PATH or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        body = await _read_capped(scope, receive, send, self.max_bytes)
        if body is None:
            return
        try:
            call = SignedRequest("POST", scope_signed_path(scope), Headers(scope=scope), body_sha256(body))
            h, done, reply = self.hot_path.answer(call, body, may_wait=b"wait=" in scope.get("query_string", b""))
            if done is not None:
                try:
                    fresh = await asyncio.wrap_future(done)
                except Exception:  # the database failed: the node did nothing wrong
                    raise ProtocolError(503, "the orchestrator could not record this heartbeat; retry",
                                        retry_after=1) from None
                if not fresh:
                    raise ProtocolError(401, "replayed nonce")
        except ProtocolError as e:
            self.telemetry.refused(e.status)
            return await _send_error(send, e.status, e.detail, (e.retry_after or 1) if e.status in (429, 503) else None)
        if done is None:  # the full path
            if self.full >= self.max_full:
                self.telemetry.refused(503)
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


def _json_safe(v):  # noqa: ANN001, ANN202
    """``v`` with every non-finite float replaced by its name ("nan", "inf", "-inf")."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_json_safe(x) for x in v]
    return v


API_DESCRIPTION = """Orchestrator of a swarmrl run. Node, validator and trainer calls are signed with Ed25519:
headers X-Swarm-Key (public key hex), X-Swarm-Timestamp (unix s), X-Swarm-Nonce (hex, single use),
X-Swarm-Content-SHA256 (body hash) and X-Swarm-Signature over
`swarmrl-req-v1\\nMETHOD\\npath?query\\nsha256\\ntimestamp\\nnonce` (see swarmrl.protocol.signing)."""


def create_app(cfg: OrchestratorConfig, orch: Orchestrator | None = None, run_sweeper: bool = True) -> FastAPI:
    """The orchestrator's app: its services in ``app.state.orchestrator`` (built from ``cfg`` when not given), the
    per-address buckets in ``app.state.address_limits``, the middleware (body cap, fast heartbeats), the error
    handlers, then the routers of ``routes`` in the order the routes were always registered."""
    orch = orch or Orchestrator(cfg)
    app = FastAPI(title="swarmrl orchestrator", version="1", description=API_DESCRIPTION,
                  lifespan=_lifespan(cfg, orch, run_sweeper))
    app.state.orchestrator = orch
    app.state.address_limits = AddressLimits.from_config(cfg)  # each app has its own buckets
    app.add_middleware(_BodyCap, max_bytes=cfg.max_json_bytes)
    app.add_middleware(_FastHeartbeat, hot_path=orch.hot_path, telemetry=orch.telemetry, max_bytes=cfg.max_json_bytes,
                       max_full=cfg.max_full_heartbeats)
    app.add_exception_handler(ProtocolError, _protocol_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    for group in (public, membership, submissions, validator, trainer):
        app.include_router(group.router)
    return app


def _lifespan(cfg: OrchestratorConfig, orch: Orchestrator, run_sweeper: bool):  # noqa: ANN202
    """The app's lifespan: the sweeper (membership, metrics file) while it serves; on shutdown the heartbeat
    writer commits what it holds."""
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202
        task = None
        if run_sweeper:
            async def sweeper() -> None:
                while True:
                    await asyncio.sleep(cfg.sweep_interval_s)
                    try:
                        await run_in_threadpool(orch.membership.sweep)
                        await run_in_threadpool(orch.stats.maybe_write_snapshot)
                    except Exception:  # keep sweeping; a DB hiccup must not kill membership
                        log.exception("sweep failed")
            task = asyncio.create_task(sweeper())
        yield
        await run_in_threadpool(orch.hot_path.close)  # the heartbeat writer commits what it holds
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return lifespan


async def _protocol_error(req: Request, e: ProtocolError) -> JSONResponse:
    """A ``ProtocolError`` becomes its status with ``{"detail"}`` (counted as refused)."""
    telemetry: Telemetry = req.app.state.orchestrator.telemetry
    telemetry.refused(e.status, upload=req.url.path.startswith(UPLOAD_PREFIX))
    # 429/503 always say when to come back; another refusal only when it may pass later (a stake not yet deposited)
    later = e.status in (429, 503) or e.retry_after is not None
    headers = {"Retry-After": str(max(1, math.ceil(e.retry_after or 1)))} if later else None
    return JSONResponse({"detail": e.detail}, status_code=e.status, headers=headers)


async def _invalid(_req: Request, e: RequestValidationError) -> JSONResponse:
    """422 with pydantic's reasons; a NaN or Infinity they quote (the input refused) is quoted as a string, so the
    reply is valid JSON instead of a 500."""
    return JSONResponse({"detail": _json_safe(jsonable_encoder(e.errors()))}, status_code=422)
