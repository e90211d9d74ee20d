"""The SHARDCAST client: fetch one signed version from several servers in parallel.

    from swarmrl.shardcast import fetch
    res = fetch(["http://relay-a:8601", "http://relay-b:8601"], out="model.safetensors",
                origin_pubkey="origin.key.pub", version="latest", options=FetchOptions(wait_s=30))
    res.version, res.path, res.blake3

The settings of a fetch are one frozen ``FetchOptions`` (``swarmrl.shardcast.client.options``), passed whole;
the names below (``parallel``, ``max_server_failures``, ...) are its fields.

How it works: ask every server what it has (``/versions.json``, long-poll capable; a plain static
server's ``distribution.txt`` also works for discovery), pick the version, get its manifest from any
server and verify the origin's Ed25519 signature (a forged or altered manifest is rejected and
that server excluded). Then shards are fetched ``parallel`` at a time; each shard goes to the
server with the best measured throughput per active download (unmeasured servers are probed
first), is written at its offset into a temporary file and checked against the signed per-shard
BLAKE3 hash. A server that serves a bad shard is excluded at once and the shard re-fetched
elsewhere; a server failing ``max_server_failures`` times in a row is excluded; a server that misses the
progress deadline (no response, no byte for ``stall_s``, under ``min_bps``) is dropped for that shard at
once and the shard resumed elsewhere with a Range request; each shard gets at most ``max_attempts`` tries, after which
a ``FetchError`` says what each server did. The whole file is re-hashed against the signed
checksum (``verify_whole``) and only then renamed to ``out``. No probe file is ever needed.

The machinery lives in ``pool`` (server health, throughput and choice; discovery; the signed manifest)
and ``download`` (per-shard download and verification, sinks, whole-file hashing); this module holds
the public entry points and re-exports the rest.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from swarmrl.shardcast.client.download import (  # noqa: F401  (re-exported)
    FileSink,
    ShardSink,
    Stalled,
    download_shards,
)
from swarmrl.shardcast.client.options import FetchOptions
from swarmrl.shardcast.client.pool import (  # noqa: F401  (re-exported)
    FetchError,
    ManifestNotVerified,
    ServerPool,
    ServerState,
    discover,
    get_manifest,
    get_manifest_raw,
    new_session,
    server_versions,
)
from swarmrl.shardcast.client.wholehash import InOrderHasher, hash_file
from swarmrl.shardcast.layout import Manifest, atomic_write
from swarmrl.shardcast.signing import load_public_key

__all__ = ["FetchError", "FetchOptions", "FetchResult", "ManifestNotVerified", "ServerPool", "fetch", "fetch_async",
           "discover", "get_manifest", "download_shards", "ShardSink", "FileSink", "hash_file"]


@dataclass
class FetchResult:
    version: int
    path: Path
    size: int
    blake3: str
    seconds: float
    manifest: Manifest | None  # None: an unsigned 0.3.x version fetched with ``FetchOptions(insecure=True)``
    bytes_by_server: dict[str, int]
    excluded: dict[str, str]
    resumed_shards: int = 0
    signed: bool = True

    @property
    def mb_per_s(self) -> float:
        return self.size / 1e6 / self.seconds if self.seconds > 0 else float("inf")



async def fetch_async(servers: Iterable[str], out: str | Path, origin_pubkey: Any | None, *,
                      version: int | str = "latest", min_version: int = 0,
                      on_shard: Callable[[int, int], None] | None = None,
                      options: FetchOptions = FetchOptions(), expect_blake3: str | None = None) -> FetchResult:
    """Async fetch; see module docstring. ``version``: an int or "latest" (highest version any
    server advertises whose signed manifest verifies, and >= ``min_version``). ``on_shard(done, total)``: progress
    callback. ``options``: how (``FetchOptions``: attempts, parallelism, progress deadline, ``wait_s`` to keep
    polling for the version to appear, ...).
    ``options.insecure``: when no server offers a signed manifest for the version (a plain SHARDCAST 0.3.x server),
    or ``origin_pubkey`` is None, fetch it anyway, checked only against the whole-file checksum the same untrusted
    server lists (``unsigned``); a warning goes to stderr. A manifest that is offered but does not verify is still
    an error. ``expect_blake3``: the whole file's hash known from elsewhere (the run's base model identity); a
    signed manifest naming another is refused before any shard is fetched."""
    t0 = time.perf_counter()
    if origin_pubkey is None and not options.insecure:
        raise ValueError("an origin public key is required (or FetchOptions(insecure=True) for an unsigned 0.3.x "
                         "server)")
    pub = load_public_key(origin_pubkey) if origin_pubkey is not None else None
    servers = list(servers)
    options = replace(options, parallel=options.streams(len(servers)))  # counted as given (repeats included)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pool = ServerPool(servers, max_failures=options.max_server_failures)
    want = None if version == "latest" else int(version)
    deadline = time.monotonic() + options.wait_s
    async with new_session() as session:
        manifest = await _signed_manifest(session, pool, pub, want, min_version, options.insecure, deadline)
        if manifest is None:  # insecure: a plain 0.3.x server
            # a fresh pool: a 0.3.x server's missing manifests are not failures of the server
            fresh = ServerPool(servers, max_failures=options.max_server_failures)
            if expect_blake3 is not None:
                raise FetchError(f"v{want}: no signed manifest to check against the expected hash")
            return await _fetch_unsigned(session, fresh, out, want, min_version, options, t0, deadline)
        if expect_blake3 is not None and manifest.blake3 != expect_blake3:
            raise FetchError(f"v{manifest.version}'s hash {manifest.blake3[:16]}... (signed manifest) is not the "
                             f"expected {expect_blake3[:16]}...")
        part = await _download_part(session, pool, manifest, out, options, on_shard)
    if part.hasher is not None:
        digest = await asyncio.to_thread(part.hasher.finish)
        if digest != manifest.blake3:
            part.tmp.unlink(missing_ok=True)
            part.progress.path.unlink(missing_ok=True)
            raise FetchError(f"v{manifest.version}: whole-file BLAKE3 {digest} != signed {manifest.blake3}")
    os.replace(part.tmp, out)
    part.progress.path.unlink(missing_ok=True)
    return FetchResult(version=manifest.version, path=out, size=manifest.size, blake3=manifest.blake3,
                       seconds=time.perf_counter() - t0, manifest=manifest,
                       bytes_by_server={s.url: s.bytes for s in pool},
                       excluded={s.url: s.reason for s in pool if s.reason}, resumed_shards=part.resumed)


async def _signed_manifest(session: Any, pool: ServerPool, pub: Any | None, want: int | None, min_version: int,
                           insecure: bool, deadline: float) -> Manifest | None:
    """The manifest of version ``want`` (None: the highest listed, >= ``min_version``) whose origin signature
    verifies, polling the servers until ``deadline``. None when there is no key, or (``insecure``) when the
    version is listed but no server offers a signed manifest, or nothing came in time."""
    manifest = None
    last_err: Exception | None = None
    while manifest is None and pub is not None:
        await discover(session, pool, count_failures=time.monotonic() >= deadline)
        listed = sorted({v for s in pool.healthy() for v in s.versions
                         if (v == want if want is not None else v >= max(min_version, 1))}, reverse=True)
        for v in listed:
            try:
                manifest = await get_manifest(session, pool, v, pub)
                break
            except FetchError as e:
                last_err = e
        if manifest is None and insecure and listed and not isinstance(last_err, ManifestNotVerified):
            break  # listed, but nobody serves a signed manifest: a plain 0.3.x server
        if manifest is None:
            if time.monotonic() >= deadline:
                if isinstance(last_err, ManifestNotVerified):  # offered, but signed under another key
                    raise last_err
                if insecure:
                    break
                what = f"v{want}" if want is not None else "any version"
                detail = f" ({last_err})" if last_err else ""
                raise FetchError(f"no server offers {what}{detail}; servers: {pool.report()}")
            await asyncio.sleep(0.25)
    return manifest


@dataclass
class _Progress:
    """The shards of one manifest verified in the part file so far, recorded beside it (``.NAME.part.json``) so
    that the next fetch of the same version into the same place resumes from them."""

    path: Path
    manifest: Manifest
    done: set[int]
    last_save: float = 0.0

    @classmethod
    def load(cls, path: Path, manifest: Manifest, sink: FileSink) -> _Progress:
        """The shards a previous fetch recorded for this exact manifest, each re-verified in the part file."""
        done: set[int] = set()
        try:
            st = json.loads(path.read_text())
            if st.get("version") == manifest.version and st.get("blake3") == manifest.blake3:
                done = {i for i in st.get("done", []) if type(i) is int and 1 <= i <= manifest.num_shards
                        and sink.verify_existing(i)}
        except (OSError, ValueError):
            pass
        return cls(path, manifest, done)

    def save(self) -> None:
        self.last_save = time.monotonic()
        atomic_write(self.path, json.dumps({"version": self.manifest.version, "blake3": self.manifest.blake3,
                                            "done": sorted(self.done)}).encode(), fsync=False)


@dataclass
class _Part:
    """A downloaded part file (every shard verified), not yet checked whole nor renamed."""

    tmp: Path
    progress: _Progress
    hasher: InOrderHasher | None
    resumed: int


async def _download_part(session: Any, pool: ServerPool, manifest: Manifest, out: Path, options: FetchOptions,
                         on_shard: Callable[[int, int], None] | None) -> _Part:
    """Every shard of ``manifest`` into ``.NAME.part`` beside ``out`` (those a previous fetch verified are kept),
    hashed in order behind the download when ``verify_whole``; progress is recorded at most every 0.5 s and
    when the download fails."""
    tmp = out.parent / f".{out.name}.part"
    state_path = out.parent / f".{out.name}.part.json"
    try:
        sink = FileSink(tmp, manifest)
    except OSError as e:  # no room for it (the blocks are reserved up front), a directory not writable
        raise FetchError(f"v{manifest.version}: cannot make {tmp} ({manifest.size:,} bytes) here: {e}") from e
    try:
        # resume across runs: shards recorded as done for this exact manifest, re-verified
        progress = _Progress.load(state_path, manifest, sink)
        done = progress.done
        resumed = len(done)
        todo = [i for i in range(1, manifest.num_shards + 1) if i not in done]
        progress.last_save = time.monotonic()
        hasher = InOrderHasher(tmp, manifest, done) if options.verify_whole else None
        if hasher is not None:
            sink.on_write, sink.on_reset = hasher.progress, hasher.reset

        def shard_done(idx: int) -> None:
            done.add(idx)
            if hasher is not None:
                hasher.mark(idx)
            if time.monotonic() - progress.last_save > 0.5:
                progress.save()  # a killed process loses at most ~0.5 s of verified shards
            if on_shard:
                on_shard(len(done), manifest.num_shards)

        try:
            await download_shards(session, pool, manifest, todo, sink, options=options, on_shard=shard_done,
                                  refresh_s=1.0)
        except BaseException:
            if done:
                progress.save()  # the next fetch of this version into ``out`` resumes from here
            if hasher is not None:
                hasher.close()
            raise
        if options.fsync:
            await asyncio.to_thread(os.fsync, sink.fd)
    finally:
        sink.close()
    return _Part(tmp, progress, hasher, resumed)


async def _fetch_unsigned(session: Any, pool: ServerPool, out: Path, want: int | None, min_version: int,
                          options: FetchOptions, t0: float, deadline: float) -> FetchResult:
    from swarmrl.shardcast.client.unsigned import INSECURE_WARNING, fetch_unsigned  # noqa: PLC0415  # rarely used

    res = await fetch_unsigned(session, pool, out, want=want, min_version=min_version, options=options,
                               wait_until=deadline)
    print(INSECURE_WARNING.format(version=res.version, servers=", ".join(res.bytes_by_server) or "the server"),
          file=sys.stderr, flush=True)
    return FetchResult(version=res.version, path=out, size=res.size, blake3=res.blake3,
                       seconds=time.perf_counter() - t0, manifest=None, bytes_by_server=res.bytes_by_server,
                       excluded={s.url: s.reason for s in pool if s.reason}, signed=False)


def fetch(servers: Iterable[str], out: str | Path, origin_pubkey: Any | None, *, version: int | str = "latest",
          min_version: int = 0, on_shard: Callable[[int, int], None] | None = None,
          options: FetchOptions = FetchOptions(), expect_blake3: str | None = None) -> FetchResult:
    """Synchronous wrapper of :func:`fetch_async` (for worker code without an event loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(fetch_async(list(servers), out, origin_pubkey, version=version, min_version=min_version,
                                       on_shard=on_shard, options=options, expect_blake3=expect_blake3))
    raise RuntimeError("fetch() called from a running event loop; await fetch_async() instead")
