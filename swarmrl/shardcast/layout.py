"""The on-disk / on-wire layout: public SHARDCAST paths plus our signed per-version manifest.

Public layout (kept byte-for-byte so static servers and public tools interoperate)::

    /distribution.txt            "v<N>: <blake3-hex>|<num_shards>" per complete version, ascending
    /v<N>/shard_<IIIII>.bin      raw shard bytes, 1-based, five digits
    /data1.bin                   small probe file (old clients measure bandwidth with it)

Ours, beside it::

    /v<N>/manifest.json          {"manifest": {...}, "signature": "<ed25519 hex>"}
    /versions.json               live state of a server (complete + in-progress versions), long-poll

Everything parsed here may come from an untrusted peer, so parsing is strict: size limits,
exact field sets and types, bounded counts, and clear ``LayoutError`` messages.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_SHARD_SIZE", "MANIFEST_FORMAT", "LayoutError", "ShardInfo", "Manifest", "DistEntry",
    "shard_name", "shard_relpath", "version_dir", "parse_distribution", "format_distribution",
    "canonical_json", "atomic_write", "MAX_SHARDS", "MAX_MANIFEST_BYTES", "MAX_DISTRIBUTION_BYTES",
    "MAX_VERSION", "BASE_VERSION", "retain",
]

DEFAULT_SHARD_SIZE = 50_000_000
MANIFEST_FORMAT = "swarmrl-shardcast/1"
MAX_SHARDS = 99_999  # five digits
MAX_VERSION = 10**12
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
MAX_DISTRIBUTION_BYTES = 4 * 1024 * 1024
MAX_DISTRIBUTION_LINES = 100_000
MANIFEST_NAME = "manifest.json"
DISTRIBUTION_NAME = "distribution.txt"
PROBE_NAME = "data1.bin"

_HEX64 = re.compile(r"[0-9a-f]{64}")
_DIST_LINE = re.compile(r"v(\d{1,13}): ([0-9a-f]{64})\|(\d{1,5})")


class LayoutError(ValueError):
    """Malformed or inconsistent layout data (untrusted input rejected)."""


def shard_name(index: int) -> str:
    if not 1 <= index <= MAX_SHARDS:
        raise LayoutError(f"shard index {index} out of range 1..{MAX_SHARDS}")
    return f"shard_{index:05d}.bin"


def version_dir(version: int) -> str:
    return f"v{version}"


def shard_relpath(version: int, index: int) -> str:
    return f"{version_dir(version)}/{shard_name(index)}"


@dataclass(frozen=True)
class DistEntry:
    version: int
    checksum: str  # blake3 hex of the whole file
    num_shards: int


def parse_distribution(text: str | bytes) -> list[DistEntry]:
    """Parse distribution.txt strictly (untrusted). Empty text is a valid, empty manifest."""
    if isinstance(text, bytes):
        if len(text) > MAX_DISTRIBUTION_BYTES:
            raise LayoutError("distribution.txt too large")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise LayoutError("distribution.txt is not UTF-8") from None
    elif len(text) > MAX_DISTRIBUTION_BYTES:
        raise LayoutError("distribution.txt too large")
    out: list[DistEntry] = []
    lines = [ln.strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    if len(lines) > MAX_DISTRIBUTION_LINES:
        raise LayoutError("distribution.txt has too many lines")
    for ln in lines:
        m = _DIST_LINE.fullmatch(ln)
        if not m:
            raise LayoutError(f"bad distribution.txt line: {ln[:100]!r}")
        v, n = int(m.group(1)), int(m.group(3))
        if not (0 <= v <= MAX_VERSION) or n < 1:
            raise LayoutError(f"bad distribution.txt line: {ln[:100]!r}")
        if out and v <= out[-1].version:
            raise LayoutError("distribution.txt versions are not strictly ascending")
        out.append(DistEntry(v, m.group(2), n))
    return out


def format_distribution(entries: list[DistEntry]) -> str:
    entries = sorted(entries, key=lambda e: e.version)
    return "".join(f"v{e.version}: {e.checksum}|{e.num_shards}\n" for e in entries)


BASE_VERSION = 0  # the run's base model (``swarmrl.models.bundle``): kept by every server beside the newest versions


def retain(entries: list[DistEntry], keep: int) -> tuple[list[DistEntry], list[DistEntry]]:
    """(kept, dropped) of ``entries``: the newest ``keep`` versions, and version 0 (the base model, which a node
    joining late still needs) whatever its age."""
    entries = sorted(entries, key=lambda e: e.version)
    base = [e for e in entries if e.version == BASE_VERSION]
    rest = [e for e in entries if e.version != BASE_VERSION]
    return base + rest[-keep:], rest[:-keep]


def canonical_json(obj: Any) -> bytes:
    """The exact bytes that get signed: sorted keys, no spaces, ASCII only."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


@dataclass(frozen=True)
class ShardInfo:
    size: int
    blake3: str


@dataclass(frozen=True)
class Manifest:
    """The signed description of one version. Shard i (1-based) covers bytes
    [(i-1)*shard_size, (i-1)*shard_size + shards[i-1].size) of the checkpoint file."""

    version: int
    size: int
    shard_size: int
    blake3: str  # whole file
    shards: tuple[ShardInfo, ...]
    filename: str = "checkpoint.bin"
    created: int = 0  # unix seconds (informational)

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def shard_offset(self, index: int) -> int:
        return (index - 1) * self.shard_size

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "version": self.version,
            "size": self.size,
            "shard_size": self.shard_size,
            "blake3": self.blake3,
            "filename": self.filename,
            "created": self.created,
            "shards": [{"size": s.size, "blake3": s.blake3} for s in self.shards],
        }

    def dist_entry(self) -> DistEntry:
        return DistEntry(self.version, self.blake3, self.num_shards)

    @classmethod
    def from_dict(cls, d: Any) -> Manifest:
        """Strictly validate an untrusted manifest body."""
        if not isinstance(d, dict):
            raise LayoutError("manifest is not an object")
        want = {"format", "version", "size", "shard_size", "blake3", "filename", "created", "shards"}
        if set(d) != want:
            raise LayoutError(f"manifest fields {sorted(d)} != {sorted(want)}")
        if d["format"] != MANIFEST_FORMAT:
            raise LayoutError(f"unknown manifest format {str(d['format'])[:50]!r}")

        def _int(name: str, lo: int, hi: int) -> int:
            v = d[name]
            if type(v) is not int or not lo <= v <= hi:
                raise LayoutError(f"manifest {name} must be an int in [{lo}, {hi}]")
            return v

        version = _int("version", 0, MAX_VERSION)
        size = _int("size", 1, 1 << 50)
        shard_size = _int("shard_size", 1, 1 << 40)
        created = _int("created", 0, 1 << 40)
        if not isinstance(d["blake3"], str) or not _HEX64.fullmatch(d["blake3"]):
            raise LayoutError("manifest blake3 must be 64 lowercase hex chars")
        fn = d["filename"]
        if not isinstance(fn, str) or not (0 < len(fn) <= 255) or "/" in fn or "\\" in fn or fn in (".", "..") \
                or "\x00" in fn:
            raise LayoutError("manifest filename must be a plain file name")
        shards = d["shards"]
        if not isinstance(shards, list) or not 1 <= len(shards) <= MAX_SHARDS:
            raise LayoutError(f"manifest shards must be a list of 1..{MAX_SHARDS}")
        expect_n = -(-size // shard_size)
        if len(shards) != expect_n:
            raise LayoutError(f"manifest has {len(shards)} shards, size/shard_size implies {expect_n}")
        infos = []
        for i, s in enumerate(shards, 1):
            if not isinstance(s, dict) or set(s) != {"size", "blake3"}:
                raise LayoutError(f"manifest shard {i} must be {{size, blake3}}")
            want_size = shard_size if i < expect_n else size - shard_size * (expect_n - 1)
            if type(s["size"]) is not int or s["size"] != want_size:
                raise LayoutError(f"manifest shard {i} size {s['size']!r} != {want_size}")
            if not isinstance(s["blake3"], str) or not _HEX64.fullmatch(s["blake3"]):
                raise LayoutError(f"manifest shard {i} blake3 must be 64 lowercase hex chars")
            infos.append(ShardInfo(s["size"], s["blake3"]))
        return cls(version, size, shard_size, d["blake3"], tuple(infos), fn, created)


def atomic_write(path: str | Path, data: bytes, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` via a temp file in the same directory and os.replace."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # world-readable like any served file (mkstemp makes 0600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
