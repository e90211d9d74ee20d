"""What every router shares: the limits of paths and query parameters, the documented error responses, the
request helpers (the path as signed, the trusted-address mark) and the FastAPI dependencies the endpoints declare:
one per service (read from ``request.app.state.orchestrator``, the ``Orchestrator`` of the app), ``signed(...)``
(authenticates the caller), and ``JOINS`` / ``PUBLIC`` (spend a token of the source address's bucket, the app's
own ``AddressLimits``).

Kept apart from ``http`` so the routers and the ASGI middleware there import it without a cycle."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi import Path as PathParam

from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.orchestrator.assignments import Assignments
from swarmrl.protocol.orchestrator.auth import Auth, RateLimiter, SignedRequest
from swarmrl.protocol.orchestrator.describe import RunDescriber
from swarmrl.protocol.orchestrator.diloco import DilocoRounds
from swarmrl.protocol.orchestrator.errors import Principal, ProtocolError
from swarmrl.protocol.orchestrator.ledger import Ledger
from swarmrl.protocol.orchestrator.membership import Membership
from swarmrl.protocol.orchestrator.run_state import RunState
from swarmrl.protocol.orchestrator.service import Orchestrator
from swarmrl.protocol.orchestrator.stats import Stats
from swarmrl.protocol.orchestrator.submissions import Submissions
from swarmrl.protocol.orchestrator.telemetry import Telemetry
from swarmrl.protocol.orchestrator.verdicts import Verdicts
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


def signed_request(request: Request, body_hash: str | None) -> SignedRequest:
    """What the signature of ``request`` covers (``body_hash``: of the body read; None: checked later)."""
    return SignedRequest(request.method, scope_signed_path(request.scope), request.headers, body_hash)


def trusted(request: Request) -> None:
    """The request was authenticated: its source address may use the connections reserved for trusted ones."""
    mark = (request.scope.get("extensions") or {}).get(TRUST_EXTENSION)
    if mark is not None:
        mark()


async def raw_body(request: Request) -> bytes:
    return await request.body()


# ---- the services (async: no thread hop to read an attribute) --------------------------------------------------
def orchestrator(request: Request) -> Orchestrator:
    return request.app.state.orchestrator


async def _auth(request: Request) -> Auth:
    return orchestrator(request).auth


async def _membership(request: Request) -> Membership:
    return orchestrator(request).membership


async def _assignments(request: Request) -> Assignments:
    return orchestrator(request).assignments


async def _submissions(request: Request) -> Submissions:
    return orchestrator(request).submissions


async def _verdicts(request: Request) -> Verdicts:
    return orchestrator(request).verdicts


async def _diloco(request: Request) -> DilocoRounds:
    return orchestrator(request).diloco


async def _ledger(request: Request) -> Ledger:
    return orchestrator(request).ledger


async def _run(request: Request) -> RunState:
    return orchestrator(request).run


async def _stats(request: Request) -> Stats:
    return orchestrator(request).stats


async def _telemetry(request: Request) -> Telemetry:
    return orchestrator(request).telemetry


async def _describer(request: Request) -> RunDescriber:
    return orchestrator(request).describer


AuthDep = Annotated[Auth, Depends(_auth)]
MembershipDep = Annotated[Membership, Depends(_membership)]
AssignmentsDep = Annotated[Assignments, Depends(_assignments)]
SubmissionsDep = Annotated[Submissions, Depends(_submissions)]
VerdictsDep = Annotated[Verdicts, Depends(_verdicts)]
DilocoDep = Annotated[DilocoRounds, Depends(_diloco)]
LedgerDep = Annotated[Ledger, Depends(_ledger)]
RunStateDep = Annotated[RunState, Depends(_run)]
StatsDep = Annotated[Stats, Depends(_stats)]
TelemetryDep = Annotated[Telemetry, Depends(_telemetry)]
DescriberDep = Annotated[RunDescriber, Depends(_describer)]


# ---- callers -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AddressLimits:
    """One app's buckets per source address, apart from the per-key limiter of signed requests: joining (each
    registration is a new key, so the per-key limiter cannot see a flood of them) and the unsigned public views."""

    joins: RateLimiter
    public: RateLimiter

    @classmethod
    def from_config(cls, cfg: OrchestratorConfig) -> AddressLimits:
        return cls(RateLimiter(cfg.register_rate_per_s, cfg.register_burst),
                   RateLimiter(cfg.public_rate_per_s, cfg.public_burst))


def _spend(request: Request, limiter: RateLimiter, what: str) -> None:
    """One token of the client address's bucket: 429 with ``Retry-After`` when empty (the address is the TCP peer;
    uvicorn replaces it by X-Forwarded-For only for proxies it trusts)."""
    host = request.client.host if request.client else "?"
    wait = limiter.take(host)
    if wait:
        raise ProtocolError(429, f"{what} rate limit exceeded for {host}", retry_after=wait)


async def _limit_joins(request: Request) -> None:
    _spend(request, request.app.state.address_limits.joins, "registration")


async def _limit_public(request: Request) -> None:
    _spend(request, request.app.state.address_limits.public, "public API")


JOINS = [Depends(_limit_joins)]  # registration, per source address
PUBLIC = [Depends(_limit_public)]  # unsigned reads, per source address


def signed(*roles: str, allow_unregistered: bool = False) -> Callable[..., Principal]:
    """A dependency authenticating the request as one of ``roles`` (its body hashed once, shared with an endpoint
    that reads the body through ``raw_body`` too)."""
    def dep(request: Request, body: bytes = Depends(raw_body)) -> Principal:
        p = orchestrator(request).auth.authenticate(signed_request(request, body_sha256(body)), roles,
                                                    allow_unregistered)
        if not allow_unregistered:  # registration vouches for an address only once it succeeds
            trusted(request)
        return p
    return dep
