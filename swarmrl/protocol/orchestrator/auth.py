"""Authentication of signed requests, shared by every service that admits a caller: the per-key rate limiter
and ``Auth``, the admission checks (signature, clock skew, body hash, rate, key lookup, ejection, role,
single-use nonce) with the nonces' memory (``heartbeat_cache.NonceCache``) and their rows."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.db import Database
from swarmrl.protocol.orchestrator.errors import Principal, ProtocolError
from swarmrl.protocol.orchestrator.heartbeat_cache import NonceCache
from swarmrl.protocol.signing import SignatureError, SignedHeaders, check_timestamp, parse_headers, verify_signature
from swarmrl.protocol.tables import Node, Nonce


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


@dataclass(frozen=True)
class SignedRequest:
    """What a request's signature covers, as received: the method, the path as sent (with its query), the
    headers (``X-Swarm-*``), and the sha256 of the body read (None: the body is checked later against the signed
    hash, as an upload streamed after admission is)."""

    method: str
    path: str
    headers: Mapping[str, str]
    body_sha256: str | None = None


class Auth:
    """Admits signed requests. ``verify`` needs no database (the hot path runs it alone); ``admit`` runs inside
    the caller's transaction, so the nonce row commits with what the request does; ``authenticate`` is both."""

    def __init__(self, cfg: OrchestratorConfig, db: Database, nonces: NonceCache, limiter: RateLimiter) -> None:
        self._cfg = cfg
        self._db = db
        self.nonces = nonces  # every unexpired nonce seen by this process
        self.limiter = limiter  # per public key
        n = cfg.heartbeats_per_interval  # per public key, heartbeats only
        self.heartbeats = RateLimiter(n / cfg.heartbeat_interval_s, n)

    def pace_heartbeat(self, h: SignedHeaders, now: float | None = None) -> None:
        """Refuse a heartbeat beyond ``heartbeats_per_interval`` per interval from this key (429, with when to come
        back): the interval is named in every reply, and a node that beats faster gains nothing but load on us."""
        later = self.heartbeats.take(h.public_key, now)
        if later > 0:
            raise ProtocolError(429, f"heartbeats faster than {self._cfg.heartbeats_per_interval} per "
                                     f"{self._cfg.heartbeat_interval_s:g} s interval", retry_after=later)

    def verify(self, req: SignedRequest, now: float) -> SignedHeaders:
        """The checks that need no database: header syntax, clock skew, signature, body hash, rate."""
        try:
            h = parse_headers(req.headers)
            check_timestamp(h.timestamp, self._cfg.max_clock_skew_s, now)
            verify_signature(h, req.method, req.path)
        except SignatureError as e:
            raise ProtocolError(401, str(e)) from None
        if req.body_sha256 is not None and req.body_sha256 != h.content_sha256:
            raise ProtocolError(401, "body does not match the signed content hash (tampered or corrupted)")
        if not self.limiter.allow(h.public_key):
            raise ProtocolError(429, "rate limit exceeded for this key")
        return h

    def admit(self, s: Session, h: SignedHeaders, roles: tuple[str, ...], allow_unregistered: bool) -> Principal:
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
        expires = self.remember_nonce(h)
        s.execute(Nonce.__table__.insert().values(public_key=h.public_key, nonce=h.nonce, expires_at=expires))
        return Principal(nid, h.public_key, role, h.content_sha256)

    def remember_nonce(self, h: SignedHeaders) -> float:
        """Record ``h``'s nonce in memory (every signed path does, before its own write of it); returns when it
        expires. 401 if seen before, 503 when the memory of unexpired nonces is full."""
        expires = h.timestamp + self._cfg.max_clock_skew_s + 1.0
        seen = self.nonces.add(h.public_key, h.nonce, expires)
        if seen is False:
            raise ProtocolError(401, "replayed nonce")
        if seen is None:
            raise ProtocolError(503, f"{len(self.nonces)} unexpired nonces in memory; retry later", retry_after=5)
        return expires

    def authenticate(self, req: SignedRequest, roles: tuple[str, ...], allow_unregistered: bool = False,
                     now: float | None = None) -> Principal:
        """``verify`` then ``admit`` in a transaction of its own: the caller, or a ``ProtocolError``."""
        now = time.time() if now is None else now
        h = self.verify(req, now)
        try:
            with self._db.tx() as s:
                return self.admit(s, h, roles, allow_unregistered)
        except IntegrityError:
            raise ProtocolError(401, "replayed nonce") from None

    def load_nonces(self, now: float | None = None) -> int:
        """Remember every unexpired nonce of the database (at start: a replay across a restart is refused)."""
        now = time.time() if now is None else now
        with self._db.tx() as s:
            rows: Iterable[tuple[str, str, float]] = s.execute(
                select(Nonce.public_key, Nonce.nonce, Nonce.expires_at).where(Nonce.expires_at >= now)).all()
            return self.nonces.load(rows)

    def expire_nonces(self, s: Session, now: float) -> None:
        """Forget nonces whose timestamps could no longer pass the skew check: their rows (in ``s``) and memory."""
        s.execute(Nonce.__table__.delete().where(Nonce.expires_at < now))
        self.nonces.purge(now)
