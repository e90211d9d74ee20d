"""A version as the difference from the one before it: the changed elements of a weights file, bit-exact.

Two consecutive versions of a model's weights file (safetensors, as the trainer publishes them) have the same
header and the same layout when only the values moved: the same names, dtypes, shapes and offsets. A delta is then
the positions and new values of the elements of the data region that differ, element being ``elem`` bytes (2 for
bfloat16 weights, 4 for float32), so applying it to the base file's bytes gives the target file's bytes exactly,
checked against the target's BLAKE3, which the delta names (and which the SHARDCAST manifest signing the delta file
covers). Positions are stored as gaps (varint-free: little-endian uint32 after zlib, which packs small gaps well),
values as raw elements; both compressed with zlib.

Layout of a delta file: ``MAGIC``, a 4-byte little-endian header length, the header (canonical JSON: format,
element size, base and target BLAKE3 and size, data offset, changed count, compressed part lengths), then the
compressed gaps and the compressed values. Everything read from a delta is bounded before it is used: lengths
against the file, the changed count against the data region, positions against the data region.

A SHARDCAST version holding a delta says so in its signed manifest's file name (``delta_filename``: which version it
is against), so a node plans its path from manifests alone; a version holding a whole weights file (a keyframe) is
named ``model.safetensors`` and stays readable by any SHARDCAST client.

Pure: numpy, zlib and blake3; no server, no torch.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from dataclasses import dataclass

import blake3
import numpy as np

__all__ = ["DeltaError", "DeltaInfo", "apply_delta", "delta_base", "delta_filename", "encode_delta", "read_header"]

MAGIC = b"SWRLDLT1"
FORMAT = "swarmrl-delta/1"
MAX_HEADER = 1 << 16
_DTYPES = {2: np.uint16, 4: np.uint32}
_NAME = re.compile(r"model\.delta-from-v(\d{1,13})")


def delta_filename(base_version: int) -> str:
    """The file name a delta against version ``base_version`` is published under (its signed manifest's)."""
    return f"model.delta-from-v{base_version}"


def delta_base(filename: str) -> int | None:
    """The version a published file is a delta against (None: a whole file, a keyframe)."""
    m = _NAME.fullmatch(filename)
    return int(m.group(1)) if m else None


class DeltaError(ValueError):
    """A delta refused (the reason is the message): malformed, or not for this base."""


@dataclass(frozen=True)
class DeltaInfo:
    elem: int
    base_blake3: str
    base_size: int
    target_blake3: str
    target_size: int
    data_offset: int
    changed: int
    gaps_len: int
    values_len: int

    @property
    def share(self) -> float:
        """The share of the data region's elements that changed."""
        n = (self.target_size - self.data_offset) // self.elem
        return self.changed / n if n else 0.0


def _data_offset(buf: bytes | memoryview) -> int:
    """Where a safetensors file's data region starts (8-byte header length, then the header)."""
    if len(buf) < 8:
        raise DeltaError("not a safetensors file (under 8 bytes)")
    n = struct.unpack("<Q", bytes(buf[:8]))[0]
    if 8 + n > len(buf):
        raise DeltaError("not a safetensors file (its header runs past its end)")
    return 8 + n


def _hash(buf: bytes | memoryview) -> str:
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    h.update(buf)
    return h.hexdigest()


def encode_delta(base: bytes, target: bytes, elem: int = 2, level: int = 6) -> bytes | None:
    """The delta from ``base`` to ``target`` (two safetensors files' bytes), or None when it cannot be one: another
    header or size (a keyframe is needed), or a data region not a whole number of ``elem``-byte elements."""
    if elem not in _DTYPES:
        raise ValueError(f"element size {elem}: 2 or 4")
    off = _data_offset(target)
    if len(base) != len(target) or _data_offset(base) != off or base[:off] != target[:off] or (len(target) - off) % elem:
        return None
    dt = _DTYPES[elem]
    a = np.frombuffer(base, dtype=dt, offset=off)
    b = np.frombuffer(target, dtype=dt, offset=off)
    pos = np.flatnonzero(a != b)
    gaps = np.diff(pos, prepend=-1) - 1  # elements skipped before each changed one
    if len(gaps) and gaps.max() >= 1 << 32:
        return None
    gz = zlib.compress(gaps.astype("<u4").tobytes(), level)
    vz = zlib.compress(b[pos].astype(f"<u{elem}").tobytes(), level)
    header = json.dumps({"format": FORMAT, "elem": elem, "base_blake3": _hash(base), "base_size": len(base),
                         "target_blake3": _hash(target), "target_size": len(target), "data_offset": off,
                         "changed": int(len(pos)), "gaps_len": len(gz), "values_len": len(vz)},
                        sort_keys=True, separators=(",", ":")).encode()
    return MAGIC + struct.pack("<I", len(header)) + header + gz + vz


def read_header(delta: bytes) -> DeltaInfo:
    """The header of ``delta``, checked for shape and bounds (not yet against a base)."""
    if len(delta) < len(MAGIC) + 4 or delta[:len(MAGIC)] != MAGIC:
        raise DeltaError("not a delta file")
    n = struct.unpack("<I", delta[len(MAGIC):len(MAGIC) + 4])[0]
    start = len(MAGIC) + 4
    if n > MAX_HEADER or start + n > len(delta):
        raise DeltaError("delta header length out of bounds")
    try:
        h = json.loads(delta[start:start + n])
        info = DeltaInfo(**{k: h[k] for k in DeltaInfo.__dataclass_fields__})
    except (ValueError, KeyError, TypeError) as e:
        raise DeltaError(f"delta header unreadable: {e}") from None
    if h.get("format") != FORMAT or info.elem not in _DTYPES:
        raise DeltaError("not a delta of this format")
    ints = [info.base_size, info.target_size, info.data_offset, info.changed, info.gaps_len, info.values_len]
    if any(type(v) is not int or v < 0 for v in ints):
        raise DeltaError("delta header: sizes must be non-negative integers")
    if info.target_size != info.base_size or info.data_offset > info.target_size \
            or info.changed > (info.target_size - info.data_offset) // info.elem:
        raise DeltaError("delta header: sizes do not fit together")
    if start + n + info.gaps_len + info.values_len != len(delta):
        raise DeltaError("delta parts do not add up to the file's length (truncated or padded)")
    return info


def _inflate(data: bytes, size: int, what: str) -> bytes:
    """``data`` decompressed to exactly ``size`` bytes (never more: a bomb stops at the bound)."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, size)
    except zlib.error as e:
        raise DeltaError(f"delta {what}: {e}") from None
    if len(out) != size or d.unconsumed_tail or not d.eof:
        raise DeltaError(f"delta {what}: not {size} bytes once decompressed")
    return out


def apply_delta(base: bytes, delta: bytes) -> bytes:
    """The target file: ``base`` with ``delta`` applied, refused (``DeltaError``) unless ``base`` is the delta's
    base (its BLAKE3) and the result is the delta's target (its BLAKE3): a node's weights are the trainer's or
    nothing."""
    info = read_header(delta)
    if len(base) != info.base_size or _hash(base) != info.base_blake3:
        raise DeltaError(f"the delta is against base {info.base_blake3[:16]}..., not the version held here")
    if _data_offset(base) != info.data_offset:
        raise DeltaError("the delta's data offset is not the base's")
    start = len(MAGIC) + 4 + struct.unpack("<I", delta[len(MAGIC):len(MAGIC) + 4])[0]
    dt = _DTYPES[info.elem]
    gaps = np.frombuffer(_inflate(delta[start:start + info.gaps_len], 4 * info.changed, "positions"), dtype="<u4")
    values = np.frombuffer(_inflate(delta[start + info.gaps_len:], info.elem * info.changed, "values"),
                           dtype=f"<u{info.elem}")
    pos = np.cumsum(gaps.astype(np.int64) + 1) - 1
    n = (info.target_size - info.data_offset) // info.elem
    if len(pos) and pos[-1] >= n:
        raise DeltaError("delta positions run past the data region")
    out = bytearray(base)
    data = np.frombuffer(out, dtype=dt, offset=info.data_offset, count=n)
    data[pos] = values.astype(dt)
    if _hash(out) != info.target_blake3:
        raise DeltaError("the delta applied does not give its target (hash mismatch)")
    return bytes(out)
