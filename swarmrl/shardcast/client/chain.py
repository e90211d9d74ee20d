"""Fetching a version that may be a delta: the path from what this machine holds to the version asked for.

A SHARDCAST version's signed manifest names its file: ``model.safetensors`` for a whole weights file (a keyframe),
``model.delta-from-vM`` for the difference from version M (``swarmrl.shardcast.delta``). To obtain version N a
node walks back from N through the signed manifests alone (nothing else downloaded) until it reaches a version it
holds or a keyframe: the only ways to N, and the walk stops at the first, which is the cheaper (a held version
needs only the deltas after it). Then, oldest first, each keyframe is fetched whole and each delta fetched and
applied to the version before it, every result written as that version's file: the applied bytes must hash to the
target named inside the signed delta, so a node's weights are the publisher's bit for bit or nothing is written.

A delta is refused before any of its shards is fetched when its base is neither held nor offered by any server (with
the reason), when its signed size exceeds its base file's (no honest delta is larger than a keyframe), or when its
versions do not descend; and before anything is written when it is malformed (``apply_delta`` bounds every length
and the decompressed sizes). A download interrupted (a restart) resumes where it stopped, as any SHARDCAST download
does. The servers are asked what they list once, for the version asked for (waiting for it); the walk back reads
the older manifests from that listing, one request each.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from swarmrl.shardcast.client.fetch import _signed_manifest, fetch
from swarmrl.shardcast.client.options import FetchOptions
from swarmrl.shardcast.client.pool import FetchError, ServerPool, get_manifest, new_session
from swarmrl.shardcast.delta import DeltaError, apply_delta, delta_base
from swarmrl.shardcast.layout import Manifest, atomic_write
from swarmrl.shardcast.signing import load_public_key

__all__ = ["ChainResult", "ChainStep", "fetch_chain", "plan_chain"]

MAX_CHAIN = 10_000  # manifests walked back at most (the contract bounds keyframe_every by it)

Held = Callable[[int], "Path | None"]


@dataclass(frozen=True)
class ChainStep:
    version: int
    kind: str  # "keyframe" or "delta"
    bytes: int  # downloaded for it (the signed file's size)
    base: int | None = None  # a delta's base version


@dataclass
class ChainResult:
    version: int
    path: Path
    steps: list[ChainStep]
    seconds: float
    bytes_by_server: dict[str, int] = field(default_factory=dict)
    excluded: dict[str, str] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.steps)


async def _plan(servers: list[str], pub: Any, version: int, held: Held, options: FetchOptions) -> list[Manifest]:
    pool = ServerPool(servers, max_failures=options.max_server_failures)
    deadline = time.monotonic() + options.wait_s
    chain: list[Manifest] = []
    async with new_session() as session:
        m = await _signed_manifest(session, pool, pub, version, 0, False, deadline)
        assert m is not None  # a key is given: None only for unsigned servers
        while True:
            chain.append(m)
            base = delta_base(m.filename)
            if base is None:
                return chain  # a keyframe
            if not 0 < base < m.version:
                raise FetchError(f"v{m.version} is a delta against v{base}: a delta's base is an earlier version")
            have = held(base)
            if have is not None:
                if m.size > have.stat().st_size:
                    raise FetchError(f"v{m.version}: a delta of {m.size} bytes against v{base}'s file of "
                                     f"{have.stat().st_size} is larger than a whole version; refused")
                return chain
            if len(chain) >= MAX_CHAIN:
                raise FetchError(f"v{version}: no keyframe within {MAX_CHAIN} versions back")
            try:  # listed by the discovery above, or by no server
                m = await get_manifest(session, pool, base, pub)
            except FetchError as e:
                raise FetchError(f"v{chain[-1].version} is a delta against v{base}, which this node does not hold "
                                 f"and no server offers ({e})") from None


def plan_chain(servers: Iterable[str], origin_pubkey: Any, version: int, held: Held,
               options: FetchOptions = FetchOptions()) -> list[Manifest]:
    """The signed manifests on the way to ``version``, newest first: it, then each delta's base in turn, down to a
    keyframe or to a delta whose base ``held(base)`` names a file of (held here). ``options.wait_s``: how long to wait
    for ``version`` itself to appear."""
    pub = load_public_key(origin_pubkey)
    return asyncio.run(_plan(list(servers), pub, version, held, options))


def fetch_chain(servers: Iterable[str], origin_pubkey: Any, version: int, *, held: Held,
                out_for: Callable[[int], Path], options: FetchOptions = FetchOptions()) -> ChainResult:
    """Version ``version``'s weights file at ``out_for(version)``, through keyframes and deltas (module docstring).
    ``held(v)``: the file of version ``v`` when this machine holds it (None otherwise); ``out_for(v)``: where
    version ``v``'s file goes (each version on the way is kept there, and is then held). Raises ``FetchError``."""
    t0 = time.perf_counter()
    servers = list(servers)
    plan = plan_chain(servers, origin_pubkey, version, held, options)
    steps: list[ChainStep] = []
    by_server: dict[str, int] = {}
    excluded: dict[str, str] = {}
    later = replace(options, wait_s=0.0)  # every version on the way is listed already
    for m in reversed(plan):
        out = out_for(m.version)
        base = delta_base(m.filename)
        if base is None:
            res = fetch(servers, out, origin_pubkey, version=m.version, options=later, expect_blake3=m.blake3)
        else:
            base_file = held(base)
            if base_file is None:  # planned as held, or made by the step before: gone meanwhile
                raise FetchError(f"v{m.version} is a delta against v{base}, which this node does not hold")
            part = out.with_name(out.name + ".delta")
            res = fetch(servers, part, origin_pubkey, version=m.version, options=later, expect_blake3=m.blake3)
            try:
                target = apply_delta(base_file.read_bytes(), part.read_bytes())
            except DeltaError as e:
                part.unlink(missing_ok=True)
                raise FetchError(f"v{m.version} (a delta against v{base}) refused: {e}") from None
            atomic_write(out, target, fsync=False)
            os.unlink(part)
        steps.append(ChainStep(m.version, "keyframe" if base is None else "delta", m.size, base))
        for url, n in res.bytes_by_server.items():
            by_server[url] = by_server.get(url, 0) + n
        excluded.update(res.excluded)
    return ChainResult(version, out_for(version), steps, time.perf_counter() - t0, by_server, excluded)
