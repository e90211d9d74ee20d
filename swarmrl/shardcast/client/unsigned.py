"""Reading a plain SHARDCAST 0.3.x server (``fetch(..., options=FetchOptions(insecure=True))`` / ``swarmrl shardcast
fetch --insecure``).

Such a server has only the public layout: ``distribution.txt`` (``v<N>: <blake3 of the whole file>|<shards>``)
and ``v<N>/shard_<IIIII>.bin``; no signed manifest, so neither the shard sizes nor per-shard hashes are known,
and the only check is the whole-file BLAKE3 taken from the same server. Anyone who controls that server can
substitute data and checksum alike; the caller warns loudly. Bounds all the same: every shard at most
``max_shard_bytes``, the whole at most ``max_total_bytes``, every request under the progress deadline of
``download``, at most ``max_attempts`` tries per shard (``FetchOptions``).

Shards land in their own files (their sizes are learnt from the responses), then are joined in order into
``.<out>.part`` while hashed, and the result is renamed to ``out`` only if the checksum matches.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import blake3

from swarmrl.shardcast.client.download import Stalled, _Deadline
from swarmrl.shardcast.client.http_get import BadResponse, HTTPStatus, RawPool, RawResponse
from swarmrl.shardcast.client.options import FetchOptions
from swarmrl.shardcast.client.pool import FetchError, ServerPool, ServerState
from swarmrl.shardcast.layout import (
    DISTRIBUTION_NAME,
    MAX_DISTRIBUTION_BYTES,
    DistEntry,
    parse_distribution,
    shard_relpath,
)

__all__ = ["UnsignedResult", "fetch_unsigned", "MAX_SHARD_BYTES", "MAX_TOTAL_BYTES"]

MAX_SHARD_BYTES = 1 << 32
MAX_TOTAL_BYTES = 1 << 40

INSECURE_WARNING = ("WARNING: --insecure: v{version} comes from a server without a signed manifest (SHARDCAST "
                    "0.3.x layout). Only its whole-file BLAKE3 checksum, served by the same untrusted server, is "
                    "checked: whoever controls {servers} can replace the data and the checksum alike.")


@dataclass(frozen=True)
class UnsignedResult:
    version: int
    size: int
    blake3: str
    bytes_by_server: dict[str, int]


async def _listing(session: RawPool, s: ServerState) -> list[DistEntry]:
    status, body = await session.get_small(f"{s.url}/{DISTRIBUTION_NAME}", MAX_DISTRIBUTION_BYTES, 15.0)
    if status != 200:
        raise HTTPStatus(status, DISTRIBUTION_NAME)
    return parse_distribution(body)


async def fetch_unsigned(session: RawPool, pool: ServerPool, out: Path, *, want: int | None, min_version: int = 0,
                         options: FetchOptions = FetchOptions(), max_shard_bytes: int = MAX_SHARD_BYTES,
                         max_total_bytes: int = MAX_TOTAL_BYTES, wait_until: float = 0.0) -> UnsignedResult:
    """Fetch version ``want`` (None: the newest listed, >= ``min_version``) from 0.3.x-layout servers into
    ``out``, checked only against the listed whole-file BLAKE3, ``options.streams(servers)`` shards at a time.
    ``wait_until`` (``time.monotonic``): how long to poll for the version (the caller's deadline, from
    ``options.wait_s``). Raises FetchError."""
    max_attempts = options.max_attempts
    while True:  # until a server lists the version, or ``wait_until`` (time.monotonic) passes
        listings: dict[str, dict[int, DistEntry]] = {}
        for s in pool.healthy():
            try:
                listings[s.url] = {e.version: e for e in await _listing(session, s)}
            except (TimeoutError, OSError, ValueError) as e:
                s.last_error = f"{DISTRIBUTION_NAME}: {type(e).__name__}: {e}"
        offered = sorted({v for lst in listings.values() for v in lst
                          if (v == want if want is not None else v >= max(min_version, 1))})
        if offered:
            break
        if time.monotonic() >= wait_until:
            what = f"v{want}" if want is not None else "any version"
            raise FetchError(f"no server lists {what} in {DISTRIBUTION_NAME}; servers: {pool.report()}")
        await asyncio.sleep(0.25)
    version = offered[-1]
    # the entry most servers agree on; servers listing something else for this version are not used
    votes: dict[DistEntry, list[str]] = {}
    for url, lst in listings.items():
        if version in lst:
            votes.setdefault(lst[version], []).append(url)
    entry, urls = max(votes.items(), key=lambda kv: len(kv[1]))
    servers = [pool.servers[u] for u in urls]
    n = entry.num_shards
    tmpdir = out.parent / f".{out.name}.shards"
    shutil.rmtree(tmpdir, ignore_errors=True)
    tmpdir.mkdir(parents=True)
    sizes: dict[int, int] = {}
    by_server: dict[str, int] = {}
    total = [0]
    try:
        queue = list(range(n, 0, -1))

        async def worker(k: int) -> None:
            while queue:
                idx = queue.pop()
                errors: list[str] = []
                for attempt in range(max_attempts):
                    live = [s for s in servers if not s.excluded(time.monotonic())]
                    if not live:
                        raise FetchError(f"shard {idx} of v{version}: no usable server left ({pool.report()})")
                    s = live[(idx + attempt + k) % len(live)]
                    try:
                        got = await _get_shard(session, s, version, idx, tmpdir / f"{idx:05d}", options,
                                               max_shard_bytes)
                    except (TimeoutError, OSError) as e:
                        errors.append(f"{s.url}: {type(e).__name__}: {e}")
                        pool.failure(s, f"shard {idx}: {type(e).__name__}: {e}")
                        continue
                    total[0] += got
                    if total[0] > max_total_bytes:
                        raise FetchError(f"v{version}: more than {max_total_bytes} bytes in all")
                    sizes[idx] = got
                    by_server[s.url] = by_server.get(s.url, 0) + got
                    pool.success(s, got, 0.0)
                    break
                else:
                    raise FetchError(f"shard {idx} of v{version}: gave up after {max_attempts} attempts: "
                                     + "; ".join(errors[-max_attempts:]))

        await asyncio.gather(*(worker(k) for k in range(max(1, min(options.streams(len(pool.servers)), n)))))
        first = sizes[1]
        if any(sizes[i] != first for i in range(1, n)) or sizes[n] > first or sizes[n] == 0:
            raise FetchError(f"v{version}: shard sizes are not those of one file cut in equal shards: "
                             f"{[sizes[i] for i in range(1, min(n, 5) + 1)]}...")
        part = out.parent / f".{out.name}.part"
        digest = await asyncio.to_thread(_join, tmpdir, n, part)
        if digest != entry.checksum:
            part.unlink(missing_ok=True)
            raise FetchError(f"v{version}: whole-file BLAKE3 {digest} != listed {entry.checksum} (servers {urls})")
        os.replace(part, out)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return UnsignedResult(version, sum(sizes.values()), entry.checksum, by_server)


async def _get_shard(session: RawPool, s: ServerState, version: int, idx: int, path: Path, options: FetchOptions,
                     limit: int) -> int:
    deadline = _Deadline(options)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    got = [0]

    def on_head(r: RawResponse) -> int:
        deadline.headers()
        if r.status != 200:
            raise HTTPStatus(r.status, r.reason)
        if r.length is not None and r.length > limit:
            raise BadResponse(f"shard of {r.length} bytes, over the limit of {limit}")
        return limit

    def on_data(view: memoryview) -> None:
        while view:
            k = os.write(fd, view)
            view = view[k:]
            got[0] += k
            deadline.data(k)

    try:
        try:
            async with asyncio.timeout(None) as timer:
                deadline.start(timer)
                await session.get(f"{s.url}/{shard_relpath(version, idx)}", {}, on_head, on_data)
        except TimeoutError as e:
            if isinstance(e, Stalled) or timer.expired():
                raise (e if isinstance(e, Stalled) else deadline.missed()) from None
            raise
    finally:
        os.close(fd)
    if got[0] == 0:
        raise BadResponse(f"empty shard {idx}")
    return got[0]


def _join(tmpdir: Path, n: int, part: Path) -> str:
    h = blake3.blake3()
    with part.open("wb") as out:
        for i in range(1, n + 1):
            with (tmpdir / f"{i:05d}").open("rb") as f:
                while chunk := f.read(8 << 20):
                    h.update(chunk)
                    out.write(chunk)
    return h.hexdigest()
