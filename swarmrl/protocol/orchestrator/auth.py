"""Authentication of signed requests: the per-key rate limiter and the admission checks (signature,
clock skew, body hash, key lookup, ejection, role, single-use nonce)."""

from __future__ import annotations

import threading
import time
from typing import Any

from sqlalchemy.exc import IntegrityError

from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.db import Database
from swarmrl.protocol.models import Node, Nonce
from swarmrl.protocol.orchestrator.errors import Principal, ProtocolError
from swarmrl.protocol.orchestrator.hot import NonceCache
from swarmrl.protocol.signing import SignatureError, SignedHeaders, check_timestamp, parse_headers, verify_signature


class RateLimiter:
    """Token bucket per key (a public key, or a source address), in memory (a restart refills buckets; nothing
    else depends on it)."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._b: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def allow(self, key: str, now: float | None = None) -> bool:
        return self.take(key, now) == 0.0

    def take(self, key: str, now: float | None = None) -> float:
        """Spend a token of ``key``'s bucket: 0.0 if there was one, else the seconds until there will be."""
        now = time.monotonic() if now is None else now
        with self._lock:
            tokens, last = self._b.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - last) * self.rate)
            if tokens < 1.0:
                self._b[key] = (tokens, now)
                return (1.0 - tokens) / self.rate
            self._b[key] = (tokens - 1.0, now)
            if len(self._b) > 200_000:  # bound memory under key churn
                self._b.clear()
            return 0.0


class AuthMixin:
    """Request authentication, part of ``Orchestrator`` (state set up by its ``__init__``)."""

    cfg: OrchestratorConfig
    db: Database
    limiter: RateLimiter
    nonces: NonceCache

    def _verify(self, method: str, path: str, headers: Any, actual_sha256: str | None, now: float) -> SignedHeaders:
        """The checks that need no database: header syntax, clock skew, signature, body hash, rate."""
        try:
            h = parse_headers(headers)
            check_timestamp(h.timestamp, self.cfg.max_clock_skew_s, now)
            verify_signature(h, method, path)
        except SignatureError as e:
            raise ProtocolError(401, str(e)) from None
        if actual_sha256 is not None and actual_sha256 != h.content_sha256:
            raise ProtocolError(401, "body does not match the signed content hash (tampered or corrupted)")
        if not self.limiter.allow(h.public_key):
            raise ProtocolError(429, "rate limit exceeded for this key")
        return h

    def _admit(self, s, h: SignedHeaders, roles: tuple[str, ...], allow_unregistered: bool) -> Principal:  # noqa: ANN001
        """Key lookup, ejection and role checks, and the nonce (inside the caller's transaction)."""
        nid = h.node_id
        node = s.get(Node, nid)
        if node is None:
            if not allow_unregistered:
                raise ProtocolError(401, "unknown key: register first")
            role = "worker"
        else:
            if node.public_key != h.public_key:
                raise ProtocolError(401, "key does not match the registered node")
            if node.status == "ejected":
                raise ProtocolError(403, f"node is ejected: {node.status_reason or 'slashed'}")
            role = node.role
        if roles and role not in roles:
            raise ProtocolError(403, f"role {role!r} may not call this endpoint")
        # the primary key (public_key, nonce) makes a reused nonce fail the insert; the in-memory copy lets the
        # heartbeat hot path refuse a replay of any signed request without a database read
        expires = self._remember_nonce(h)
        s.execute(Nonce.__table__.insert().values(public_key=h.public_key, nonce=h.nonce, expires_at=expires))
        return Principal(nid, h.public_key, role, h.content_sha256)

    def _remember_nonce(self, h: SignedHeaders) -> float:
        """Record ``h``'s nonce in memory (every signed path does, before its own write of it); returns when it
        expires. 401 if seen before, 503 when the memory of unexpired nonces is full."""
        expires = h.timestamp + self.cfg.max_clock_skew_s + 1.0
        seen = self.nonces.add(h.public_key, h.nonce, expires)
        if seen is False:
            raise ProtocolError(401, "replayed nonce")
        if seen is None:
            raise ProtocolError(503, f"{len(self.nonces)} unexpired nonces in memory; retry later", retry_after=5)
        return expires

    def authenticate(self, method: str, path: str, headers: Any, actual_sha256: str | None,
                     roles: tuple[str, ...], allow_unregistered: bool = False, now: float | None = None) -> Principal:
        now = time.time() if now is None else now
        h = self._verify(method, path, headers, actual_sha256, now)
        try:
            with self.db.tx() as s:
                return self._admit(s, h, roles, allow_unregistered)
        except IntegrityError:
            raise ProtocolError(401, "replayed nonce") from None
