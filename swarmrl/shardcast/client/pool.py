"""SHARDCAST client, servers: health and throughput bookkeeping per server (``ServerPool`` picks the
server for each shard), discovery of the versions each server offers, and the signed manifest."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from swarmrl.shardcast.client.http_get import HTTPStatus, RawPool
from swarmrl.shardcast.layout import (
    DISTRIBUTION_NAME,
    MANIFEST_NAME,
    MAX_DISTRIBUTION_BYTES,
    MAX_MANIFEST_BYTES,
    LayoutError,
    Manifest,
    parse_distribution,
)
from swarmrl.shardcast.signing import SignatureError, verify_manifest
from swarmrl.shardcast.urls import normalize_url

_EMA = 0.3


class FetchError(RuntimeError):
    """A fetch could not complete; the message says what each server did."""


class ManifestNotVerified(FetchError):
    """Every server that lists the version served a manifest whose signature does not verify under the given
    origin public key: the key is wrong (or every server serves a forged manifest)."""


@dataclass
class ServerState:
    url: str
    ema_bps: float | None = None
    active: int = 0
    failures: int = 0  # consecutive
    excluded_until: float = 0.0
    reason: str | None = None
    bytes: int = 0
    shards: int = 0
    versions: set[int] = field(default_factory=set)
    last_error: str | None = None

    def excluded(self, now: float) -> bool:
        return now < self.excluded_until


class ServerPool:
    """Health and throughput bookkeeping for a set of servers.

    ``max_failures``: failures in a row that exclude a server (``FetchOptions.max_server_failures``).
    ``exclude_s``: how long an excluded server stays out (``float('inf')`` for a one-shot fetch;
    a long-running relay uses a finite time so a healed upstream comes back).
    """

    def __init__(self, urls: Iterable[str], *, max_failures: int, exclude_s: float = float("inf")) -> None:
        norm = [normalize_url(u) for u in urls]
        self.servers = {u: ServerState(u) for u in norm}
        if not self.servers:
            raise ValueError("no servers given")
        self.max_failures = max_failures
        self.exclude_s = exclude_s

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.servers.values())

    def healthy(self) -> list[ServerState]:
        now = time.monotonic()
        return [s for s in self.servers.values() if not s.excluded(now)]

    def exclude(self, s: ServerState, reason: str) -> None:
        s.excluded_until = time.monotonic() + self.exclude_s
        s.reason = reason

    def failure(self, s: ServerState, err: str) -> None:
        s.failures += 1
        s.last_error = err
        if s.failures >= self.max_failures:
            self.exclude(s, f"{s.failures} consecutive failures, last: {err}")

    def success(self, s: ServerState, nbytes: int, seconds: float) -> None:
        s.failures = 0
        s.bytes += nbytes
        s.shards += 1
        if nbytes >= 16384 and seconds > 0:
            bps = nbytes / seconds
            s.ema_bps = bps if s.ema_bps is None else _EMA * bps + (1 - _EMA) * s.ema_bps
        if s.reason and not s.excluded(time.monotonic()):
            s.reason = None

    def pick(self, version: int, avoid: set[str]) -> ServerState | None:
        """Best server for the next shard: unmeasured idle servers first (probing), then the
        highest expected throughput per concurrent download."""
        now = time.monotonic()
        cands = [s for s in self.servers.values()
                 if not s.excluded(now) and version in s.versions and s.url not in avoid]
        if not cands:
            return None
        measured = [s.ema_bps for s in cands if s.ema_bps]
        default = max(measured) if measured else 1e9
        def score(s: ServerState) -> float:
            if s.ema_bps is None and s.active == 0:
                return float("inf")
            return (s.ema_bps or default) / (s.active + 1)
        best = max(score(s) for s in cands)
        top = [s for s in cands if score(s) >= best * 0.98]
        return random.choice(top)

    def report(self) -> str:
        parts = []
        for s in self.servers.values():
            st = f"excluded ({s.reason})" if s.reason else (f"last error: {s.last_error}" if s.last_error else "ok")
            parts.append(f"{s.url}: {st}")
        return "; ".join(parts)


def new_session(limit: int = 64) -> RawPool:
    """The HTTP client of a fetch or a relay (kept-alive connections per server; ``async with`` closes it)."""
    return RawPool(idle_per_host=limit)


async def server_versions(session: RawPool, url: str, *, since: int | None = None,
                          wait: float = 0.0) -> tuple[set[int], set[int], int | None]:
    """(complete, partial, seq) from one server; falls back to distribution.txt for static servers."""
    q = f"?since={since}&wait={wait}" if since is not None and wait > 0 else ""
    status, body = await session.get_small(f"{url}/versions.json{q}", 1 << 20, wait + 15.0)
    if status == 200:
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as e:
            raise LayoutError(f"versions.json is not JSON: {type(e).__name__}") from None
        if not isinstance(data, dict):
            raise LayoutError("versions.json is not an object")
        comp = {int(v) for v in data.get("complete", []) if type(v) is int and v >= 0}
        part = {int(k) for k in (data.get("partial") or {}) if str(k).isdigit() and int(k) >= 0}
        seq = data.get("seq")
        return comp, part, seq if type(seq) is int else None
    if status != 404:
        raise HTTPStatus(status, "versions.json")
    status, body = await session.get_small(f"{url}/{DISTRIBUTION_NAME}", MAX_DISTRIBUTION_BYTES, 15.0)
    if status != 200:
        raise HTTPStatus(status, DISTRIBUTION_NAME)
    entries = parse_distribution(body)
    return {e.version for e in entries}, set(), None


async def discover(session: RawPool, pool: ServerPool,
                   which: list[ServerState] | None = None, count_failures: bool = True) -> None:
    """Refresh every server's advertised versions; unreachable servers count a failure (unless
    ``count_failures`` is False: while waiting for a version, a server still starting up is fine)."""
    async def one(s: ServerState) -> None:
        try:
            comp, part, _ = await server_versions(session, s.url)
            s.versions = comp | part
        except (TimeoutError, OSError, LayoutError, ValueError) as e:
            msg = f"discovery: {type(e).__name__}: {e}"
            if count_failures:
                pool.failure(s, msg)
            else:
                s.last_error = msg
    await asyncio.gather(*(one(s) for s in (pool.healthy() if which is None else which)))


async def get_manifest(session: RawPool, pool: ServerPool, version: int, pub: Any) -> Manifest:
    """Fetch + verify v<version>/manifest.json from the servers that list it."""
    return (await get_manifest_raw(session, pool, version, pub))[0]


async def get_manifest_raw(session: RawPool, pool: ServerPool, version: int, pub: Any
                           ) -> tuple[Manifest, bytes]:
    """Like get_manifest, also returning the verified envelope bytes (a relay stores them as-is)."""
    errors = []
    unsigned = []  # servers whose manifest does not verify under ``pub``
    cands = [s for s in pool.healthy() if version in s.versions]
    random.shuffle(cands)
    for s in cands:
        try:
            status, data = await session.get_small(f"{s.url}/v{version}/{MANIFEST_NAME}", MAX_MANIFEST_BYTES, 30.0)
            if status != 200:
                raise HTTPStatus(status, MANIFEST_NAME)
        except (TimeoutError, OSError, LayoutError) as e:
            pool.failure(s, f"manifest v{version}: {type(e).__name__}: {e}")
            errors.append(f"{s.url}: {e}")
            continue
        try:
            return verify_manifest(data, pub, expect_version=version), data
        except LayoutError as e:  # includes SignatureError: a forged or altered manifest
            pool.exclude(s, f"invalid manifest for v{version}: {e}")
            errors.append(f"{s.url}: invalid manifest: {e}")
            if isinstance(e, SignatureError):
                unsigned.append(s.url)
    if unsigned and len(unsigned) == len(errors):
        where = f"server{'s' if len(unsigned) > 1 else ''} {', '.join(unsigned)}"
        raise ManifestNotVerified(f"the manifest signature of v{version} did not verify with the given origin public "
                                  f"key ({where}): the key is not the origin's, or the manifest is forged")
    raise FetchError(f"no server served a valid signed manifest for v{version}: " + ("; ".join(errors) or
                     "no server lists it"))
