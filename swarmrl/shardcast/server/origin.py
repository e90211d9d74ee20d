"""The origin: turns checkpoint files into published, signed SHARDCAST versions.

Usage from a trainer (synchronous code)::

    origin = Origin("/data/shardcast", key="origin.key", keep=5)
    origin.serve(port=8600)                     # optional: aiohttp server on a background thread
    fut = origin.publish("ckpt/step_120/model.safetensors", version=120)   # returns at once
    ...                                         # training goes on; fut.result() if you need to wait

``publish`` hands the file to one background thread that reads it once, writes the shards of
``v<N>.tmp/`` while hashing each shard and the whole file (BLAKE3), writes the signed manifest,
then renames the directory into place and rewrites ``distribution.txt`` atomically, so a version
is listed only once complete. The caller must not modify the file in place until the future is
done (writing the next checkpoint to a new path, or ``publish(..., move=True)`` which renames the
file into the origin directory first, is safe). Version numbers are the training steps; the
highest published version is persisted, so a restarted origin never reuses one. The last
``keep`` versions are kept on disk, and version 0 for good: the run's base model (``publish_base``), which a node
joining late fetches before anything else (``publish(path, 0)``, once).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import blake3

from swarmrl.shardcast.layout import (
    BASE_VERSION,
    DEFAULT_SHARD_SIZE,
    DISTRIBUTION_NAME,
    MANIFEST_NAME,
    DistEntry,
    LayoutError,
    Manifest,
    ShardInfo,
    atomic_write,
    format_distribution,
    parse_distribution,
    retain,
    shard_name,
)
from swarmrl.shardcast.server.shard_server import BackgroundLoop, ShardServer, ensure_probe_file
from swarmrl.shardcast.signing import (
    generate_key,
    load_private_key,
    public_key_hex,
    save_private_key,
    sign_manifest,
    verify_manifest,
)
from swarmrl.utils.serving import ConnLimits

__all__ = ["Origin", "PublishResult", "shard_file"]

STATE_NAME = "origin_state.json"
_READ_CHUNK = 8 << 20


@dataclass(frozen=True)
class PublishResult:
    version: int
    manifest: Manifest
    seconds: float


def shard_file(src: Path, dest_dir: Path, shard_size: int, fsync: bool = True) -> tuple[int, str, list[ShardInfo]]:
    """Split ``src`` into dest_dir/shard_XXXXX.bin; returns (size, whole blake3, shard infos)."""
    whole = blake3.blake3(max_threads=blake3.blake3.AUTO)
    shards: list[ShardInfo] = []
    total = 0
    buf = bytearray(min(_READ_CHUNK, shard_size))
    view = memoryview(buf)
    with src.open("rb", buffering=0) as f:
        idx = 0
        while True:
            idx += 1
            h = blake3.blake3(max_threads=blake3.blake3.AUTO)
            n_shard = 0
            out_path = dest_dir / shard_name(idx)
            with out_path.open("wb") as out:
                while n_shard < shard_size:
                    want = min(len(buf), shard_size - n_shard)
                    n = f.readinto(view[:want])
                    if not n:
                        break
                    chunk = view[:n]
                    h.update(chunk)
                    whole.update(chunk)
                    out.write(chunk)
                    n_shard += n
            if n_shard == 0:
                out_path.unlink()
                break
            shards.append(ShardInfo(n_shard, h.hexdigest()))
            total += n_shard
            if n_shard < shard_size:
                break
    if total == 0:
        raise ValueError(f"{src} is empty; nothing to publish")
    if fsync:  # once at the end: writeback of early shards overlaps reading/hashing later ones
        for i in range(1, len(shards) + 1):
            fd = os.open(dest_dir / shard_name(i), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    return total, whole.hexdigest(), shards


class Origin:
    """Owns one origin directory. Thread-safe ``publish``; one background publishing thread."""

    def __init__(self, root: str | Path, *, key: str | Path | None = None, keep: int = 5,
                 shard_size: int = DEFAULT_SHARD_SIZE, create_key: bool = True, fsync: bool = True) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self.shard_size = shard_size
        self.fsync = fsync
        key_path = Path(key) if key is not None else self.root.parent / (self.root.name + ".key")
        if key_path.exists():
            self.key = load_private_key(key_path)
        elif create_key:
            self.key = generate_key()
            save_private_key(self.key, key_path)
            (key_path.parent / (key_path.name + ".pub")).write_text(public_key_hex(self.key) + "\n")
        else:
            raise FileNotFoundError(f"origin key {key_path} not found")
        self.key_path = key_path
        self.public_key = public_key_hex(self.key)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="shardcast-publish")
        self._server: ShardServer | None = None
        self._bg: BackgroundLoop | None = None
        ensure_probe_file(self.root)
        self._cleanup_tmp()
        self._repair_distribution()
        self._last = self._recover_last_version()
        self._reserved = self._last
        self._completed = self._recover_completed()
        self._inflight: set[int] = set()

    # ---- state ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self):  # type: ignore[no-untyped-def]
        """Thread lock + an flock on <dir>/.lock, so `shardcast publish` processes serialise."""
        with self._lock:
            with open(self.root / ".lock", "a") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(f, fcntl.LOCK_UN)

    def _cleanup_tmp(self) -> None:
        for p in self.root.glob("v*.tmp"):
            shutil.rmtree(p, ignore_errors=True)

    def _repair_distribution(self) -> None:
        """A crash between a version's rename into place and the ``distribution.txt`` update left a complete,
        signed version unlisted: list it (the newest ``keep``)."""
        listed = {e.version for e in self._entries()}
        found = []
        for p in self.root.glob("v*"):
            if p.is_dir() and p.name[1:].isdigit() and int(p.name[1:]) not in listed and (p / MANIFEST_NAME).is_file():
                try:
                    found.append(verify_manifest((p / MANIFEST_NAME).read_bytes(), self.key.public_key(),
                                                 expect_version=int(p.name[1:])).dist_entry())
                except (LayoutError, ValueError):  # SignatureError is a LayoutError
                    continue  # not ours or damaged: never listed
        if found:
            entries = retain(self._entries() + found, self.keep)[0]
            atomic_write(self.root / DISTRIBUTION_NAME, format_distribution(entries).encode())

    def _recover_completed(self) -> int:
        """The newest version whose publication finished (state files without the field: the reserved one, so
        nothing of theirs is ever published twice)."""
        try:
            st = json.loads((self.root / STATE_NAME).read_text())
            return int(st.get("completed", st["last_version"]))
        except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError, json.JSONDecodeError):
            return self._reserved

    def _write_state(self) -> None:
        atomic_write(self.root / STATE_NAME,
                     json.dumps({"last_version": self._reserved, "completed": self._completed}).encode())

    def _recover_last_version(self) -> int:
        last = 0
        st = self.root / STATE_NAME
        if st.exists():
            try:
                last = int(json.loads(st.read_text())["last_version"])
            except (ValueError, KeyError, TypeError, json.JSONDecodeError):
                last = 0
        for e in self._entries():
            last = max(last, e.version)
        for p in self.root.glob("v*"):
            if p.is_dir() and p.name[1:].isdigit():
                last = max(last, int(p.name[1:]))
        return last

    def _entries(self) -> list[DistEntry]:
        p = self.root / DISTRIBUTION_NAME
        return parse_distribution(p.read_bytes()) if p.exists() else []

    @property
    def last_version(self) -> int:
        """Highest version published (or being published)."""
        return self._reserved

    def versions(self) -> list[int]:
        return [e.version for e in self._entries()]

    def is_published(self, version: int) -> bool:
        """Is ``version``'s signed manifest in place (the version dir appears whole, by rename)?"""
        return (self.root / f"v{int(version)}" / MANIFEST_NAME).is_file()

    # ---- publishing -------------------------------------------------------------------------
    def publish(self, path: str | Path, version: int | None = None, *, move: bool = False,
                filename: str | None = None) -> Future[PublishResult]:
        """Queue ``path`` as version ``version`` (default: last + 1); returns a Future at once.

        Raises ValueError at once if the version is not above every version ever published here, except the
        newest reserved one when its publication never finished (a crash mid-publish: nothing of it was ever
        served, so it is published now instead of being skipped for good).
        """
        src = Path(path)
        if not src.is_file():
            raise FileNotFoundError(src)
        with self._locked():
            self._reserved = max(self._reserved, self._recover_last_version())
            v = self._reserved + 1 if version is None else int(version)
            unfinished = (v == self._reserved > self._completed and v not in self._inflight
                          and not self.is_published(v))
            if v == BASE_VERSION:  # the base model: once, at any time (it is no step; nothing is ever reused)
                if self.is_published(v) or v in self._inflight:
                    raise ValueError("version 0 (the base model) is published already")
                self._inflight.add(v)
                if move:
                    staged = self.root / f".incoming_v{v}"
                    os.replace(src, staged)
                    src = staged
                return self._pool.submit(self._publish_now, src, v, filename or Path(path).name, move)
            if v <= self._reserved and not unfinished:
                raise ValueError(f"version {v} is not above the last published version {self._reserved} "
                                 "(versions are never reused)")
            self._reserved = v
            self._inflight.add(v)
            # persist the reservation first: a crash mid-publish must not let v be reused
            self._write_state()
            if move:
                staged = self.root / f".incoming_v{v}"
                os.replace(src, staged)
                src = staged
        return self._pool.submit(self._publish_now, src, v, filename or Path(path).name, move)

    def base(self) -> tuple[str, int] | None:
        """(BLAKE3 hex, size) of the published version 0, None when there is none."""
        if not self.is_published(BASE_VERSION):
            return None
        m = verify_manifest((self.root / f"v{BASE_VERSION}" / MANIFEST_NAME).read_bytes(), self.key.public_key(),
                            expect_version=BASE_VERSION)
        return m.blake3, m.size

    def publish_sync(self, path: str | Path, version: int | None = None, **kw: object) -> PublishResult:
        return self.publish(path, version, **kw).result()  # type: ignore[arg-type]

    def _publish_now(self, src: Path, version: int, filename: str, staged: bool) -> PublishResult:
        t0 = time.perf_counter()
        tmp = self.root / f"v{version}.tmp"
        final = self.root / f"v{version}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            size, whole, shards = shard_file(src, tmp, self.shard_size, fsync=self.fsync)
            m = Manifest(version=version, size=size, shard_size=self.shard_size, blake3=whole,
                         shards=tuple(shards), filename=filename, created=int(time.time()))
            atomic_write(tmp / MANIFEST_NAME, sign_manifest(m, self.key))
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            self._inflight.discard(version)
            raise
        finally:
            if staged:
                src.unlink(missing_ok=True)
        with self._locked():
            self._inflight.discard(version)
            entries = [e for e in self._entries() if e.version != version] + [m.dist_entry()]
            keep, drop = retain(entries, self.keep)
            atomic_write(self.root / DISTRIBUTION_NAME, format_distribution(keep).encode())
            self._last = max(self._last, version)
            self._completed = max(self._completed, version)
            self._write_state()
        for e in drop:
            shutil.rmtree(self.root / f"v{e.version}", ignore_errors=True)
        if self._server is not None:
            self._server.notify_threadsafe()
        return PublishResult(version, m, time.perf_counter() - t0)

    # ---- serving ----------------------------------------------------------------------------
    def serve(self, port: int = 0, host: str = "127.0.0.1", limits: ConnLimits | None = None,
              max_upload_mbps: float | None = None) -> str:
        """Start an aiohttp server for this directory on a background thread; returns its URL.
        ``max_upload_mbps``: cap on all shard bytes it sends together (megabits per second)."""
        if self._server is not None:
            return self._server.url
        self._bg = BackgroundLoop("shardcast-origin")
        self._server = ShardServer(self.root, limits=limits, max_upload_mbps=max_upload_mbps)
        self._bg.run(self._server.start(host, port))
        return self._server.url

    @property
    def url(self) -> str | None:
        return self._server.url if self._server else None

    def close(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait)
        if self._server is not None and self._bg is not None:
            self._bg.run(self._server.stop())
            self._bg.close()
        self._server = None
        self._bg = None

    def __enter__(self) -> Origin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
