"""What every route group shares: the limits of paths and query parameters, the documented error responses,
the request helpers (the path as signed, the trusted-address mark) and ``RouteDeps``, the per-app state a
group's routes close over (the orchestrator, its config, the rate-limiting and signature dependencies).

Kept apart from ``http`` so the route modules and the ASGI middleware there import it without a cycle."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi import Path as PathParam

from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.orchestrator.auth import RateLimiter
from swarmrl.protocol.orchestrator.errors import Principal, ProtocolError
from swarmrl.protocol.orchestrator.service import Orchestrator
from swarmrl.protocol.schemas import ErrorBody
from swarmrl.protocol.signing import body_sha256
from swarmrl.utils.serving import TRUST_EXTENSION

UPLOAD_PREFIX = "/v1/submissions/upload/"
MAX_ID = 2**62
MAX_HAVE_CHARS = 8192  # GET /v1/trainer/accepted?have=: ~700 submission ids, far more than a window lists
MAX_CHANGES_WAIT_S = 10.0  # a long poll (pending work, accepted work) holds a server thread at most this long
IdParam = Annotated[int, PathParam(ge=1, le=MAX_ID)]
VERIFIED = "swarmrl.verified"  # scope key: the signature headers the hot path checked already

ERRORS = {code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 413, 422, 429)}


def scope_signed_path(scope) -> str:  # noqa: ANN001
    """The path as sent (percent-encoding untouched) plus the raw query: what the client signed."""
    raw = scope.get("raw_path")
    path = raw.decode("latin-1") if raw else scope["path"]
    q = scope.get("query_string", b"").decode("latin-1")
    return path + (f"?{q}" if q else "")


def signed_path(request: Request) -> str:
    return scope_signed_path(request.scope)


def trusted(request: Request) -> None:
    """The request was authenticated: its source address may use the connections reserved for trusted ones."""
    mark = (request.scope.get("extensions") or {}).get(TRUST_EXTENSION)
    if mark is not None:
        mark()


def per_address(limiter: RateLimiter, what: str) -> Callable[[Request], Any]:
    """A dependency spending one token of the client address's bucket: 429 with ``Retry-After`` when empty (the
    address is the TCP peer; uvicorn replaces it by X-Forwarded-For only for proxies it trusts)."""
    async def dep(request: Request) -> None:
        host = request.client.host if request.client else "?"
        wait = limiter.take(host)
        if wait:
            raise ProtocolError(429, f"{what} rate limit exceeded for {host}", retry_after=wait)
    return dep


async def raw_body(request: Request) -> bytes:
    return await request.body()


@dataclass(frozen=True)
class RouteDeps:
    """One app's orchestrator and config, and the dependencies its routes declare: ``joins`` and ``public``
    spend a token of the source address's bucket (each app has its own buckets), ``signed(...)`` authenticates."""

    orch: Orchestrator
    cfg: OrchestratorConfig
    joins: list[Any]
    public: list[Any]

    @classmethod
    def build(cls, cfg: OrchestratorConfig, orch: Orchestrator) -> RouteDeps:
        # per source address, separate from the per-key limiter of signed requests: joining (each registration
        # is a new key, so the per-key limiter cannot see a flood of them) and the unsigned public views
        joins = [Depends(per_address(RateLimiter(cfg.register_rate_per_s, cfg.register_burst), "registration"))]
        public = [Depends(per_address(RateLimiter(cfg.public_rate_per_s, cfg.public_burst), "public API"))]
        return cls(orch, cfg, joins, public)

    def signed(self, *roles: str, allow_unregistered: bool = False) -> Callable[..., Principal]:
        """A dependency authenticating the request as one of ``roles`` (its body hashed once, shared with a
        route that reads the body through ``raw_body`` too)."""
        orch = self.orch

        def dep(request: Request, body: bytes = Depends(raw_body)) -> Principal:
            p = orch.authenticate(request.method, signed_path(request), request.headers, body_sha256(body),
                                  roles, allow_unregistered)
            if not allow_unregistered:  # registration vouches for an address only once it succeeds
                trusted(request)
            return p
        return dep
