"""The upload bomb (adversary ``bomb``, ``benchmarks/attacks/bomb.py``): a rollout file of a few kilobytes
whose rows are each of legal shape (32,768 prompt and completion tokens, one logprob per token) and whose
values repeat, so the file stores them in almost nothing while they decode to gigabytes.

The file is written by hand, page by page (the parquet format: pages, then a thrift footer), not by a parquet
writer: a writer encodes every value it is given, which took 6-20 s for 2 GiB decoded. Here each token column
of a row group is one dictionary page (the one value) and one data page whose dictionary indices are a single
run, with the repetition levels (where each row's list starts) compressed by zstd; so building the file costs
its row count, not its decoded size. ``pyarrow`` reads it back as the rows described (a test checks).
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from swarmrl.rollouts.wire import SCHEMA

TOKENS = 32_768  # per prompt and per completion: the most a row may legally hold
ROW_BYTES = TOKENS * 13  # decoded: prompt ids, completion ids (int32), logprobs (float32), completion mask (int8)
ROWS_PER_GROUP = 4096  # a row group's token column holds 4096 x 32,768 values (a page counts them in an int32)

# parquet.thrift enums
_BOOLEAN, _INT32, _INT64, _FLOAT, _BYTE_ARRAY = 0, 1, 2, 4, 6
_REQUIRED, _OPTIONAL, _REPEATED = 0, 1, 2
_UTF8, _LIST, _INT_8 = 0, 3, 15
_PLAIN, _RLE, _RLE_DICTIONARY = 0, 3, 8
_DATA_PAGE, _DICTIONARY_PAGE = 0, 2
_ZSTD = 6


# ---- thrift compact protocol: just what a parquet footer and page headers need ------------------------------
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _zigzag(n: int) -> bytes:
    return _varint((n << 1) ^ (n >> 63))


_CTYPE = {"bool": 1, "i32": 5, "i64": 6, "bin": 8, "list": 9, "struct": 12}


def _value(kind: str, v: object) -> bytes:
    if kind in ("i32", "i64"):
        return _zigzag(int(v))  # type: ignore[call-overload]
    if kind == "bin":
        b = v.encode() if isinstance(v, str) else bytes(v)  # type: ignore[arg-type]
        return _varint(len(b)) + b
    if kind == "struct":
        return _struct(v)  # type: ignore[arg-type]
    raise ValueError(kind)


def _struct(fields: Sequence[tuple[int, str, object]]) -> bytes:
    """``(field id, kind, value)`` in increasing id order; kind ``list:<elem kind>`` for lists, ``bool``."""
    out, last = bytearray(), 0
    for fid, kind, v in fields:
        if v is None:
            continue
        base = kind.split(":", 1)[0]
        ctype = (1 if v else 2) if base == "bool" else _CTYPE[base]
        out += bytes([((fid - last) << 4) | ctype]) if 0 < fid - last <= 15 else bytes([ctype]) + _zigzag(fid)
        last = fid
        if base == "list":
            elem = kind.split(":", 1)[1]
            items = list(v)  # type: ignore[call-overload]
            et = _CTYPE[elem]
            out += bytes([(len(items) << 4) | et]) if len(items) < 15 else bytes([0xF0 | et]) + _varint(len(items))
            for item in items:
                out += _value(elem, item)
        elif base != "bool":
            out += _value(kind, v)
    return bytes(out + b"\x00")


# ---- the RLE / bit-packed hybrid (levels and dictionary indices) -----------------------------------------------
def _runs(runs: Sequence[tuple[int, int]], bit_width: int) -> bytes:
    """RLE runs of ``(value, count)``."""
    width = (bit_width + 7) // 8
    return b"".join(_varint(count << 1) + value.to_bytes(width, "little") for value, count in runs if count)


def _levels(runs: Sequence[tuple[int, int]], max_level: int) -> bytes:
    """Data page v1 levels: a 4-byte length, then the hybrid encoding."""
    body = _runs(runs, max_level.bit_length())
    return struct.pack("<i", len(body)) + body


# ---- columns ---------------------------------------------------------------------------------------------------
_PHYSICAL = {pa.int8(): (_INT32, "<i"), pa.int32(): (_INT32, "<i"), pa.int64(): (_INT64, "<q"), pa.float32(): (_FLOAT, "<f"),
             pa.string(): (_BYTE_ARRAY, None), pa.binary(): (_BYTE_ARRAY, None), pa.bool_(): (_BOOLEAN, None)}


def _plain(typ: pa.DataType, values: Sequence[object]) -> bytes:
    physical, fmt = _PHYSICAL[typ]
    if fmt is not None:
        return struct.pack(f"<{len(values)}{fmt[1]}", *values)
    if physical == _BOOLEAN:
        bits = bytearray((len(values) + 7) // 8)
        for i, v in enumerate(values):
            bits[i // 8] |= bool(v) << (i % 8)
        return bytes(bits)
    return b"".join(struct.pack("<i", len(b)) + b for b in (v.encode() if isinstance(v, str) else v for v in values))


def _schema_elements() -> list[list[tuple[int, str, object]]]:
    """SCHEMA as parquet schema elements (what pyarrow writes for it: lists as list/element groups)."""
    out: list[list[tuple[int, str, object]]] = [[(4, "bin", "schema"), (5, "i32", len(SCHEMA))]]
    for f in SCHEMA:
        rep = _OPTIONAL if f.nullable else _REQUIRED
        if pa.types.is_list(f.type):
            item = f.type.value_type
            out += [[(3, "i32", rep), (4, "bin", f.name), (5, "i32", 1), (6, "i32", _LIST)],
                    [(3, "i32", _REPEATED), (4, "bin", "list"), (5, "i32", 1)],
                    [(1, "i32", _PHYSICAL[item][0]), (3, "i32", _OPTIONAL), (4, "bin", "element"),
                     (6, "i32", _INT_8 if item == pa.int8() else None)]]
        else:
            utf8 = _UTF8 if f.type == pa.string() else None
            out.append([(1, "i32", _PHYSICAL[f.type][0]), (3, "i32", rep), (4, "bin", f.name), (6, "i32", utf8)])
    return out


def _page(kind: int, n_values: int, body: bytes, dictionary: bool = False, encoding: int = _PLAIN
          ) -> tuple[bytes, int]:
    """Header + zstd-compressed body; and the page's uncompressed size with its header."""
    data = pa.compress(body, codec="zstd", asbytes=True)
    sub = [(1, "i32", n_values), (2, "i32", encoding)]
    if not dictionary:
        sub += [(3, "i32", _RLE), (4, "i32", _RLE)]
    header = _struct([(1, "i32", kind), (2, "i32", len(body)), (3, "i32", len(data)),
                      (7 if dictionary else 5, "struct", sub)])
    return header + data, len(header) + len(body)


def _column(f: pa.Field, values: Sequence[object], n: int) -> tuple[bytes, int, int, list[int], int]:
    """One row group's chunk of column ``f``: flat ``values`` (one per row), or for a list column one value
    repeated TOKENS times per row (none: empty lists). Returns its bytes, uncompressed size, value count (levels
    included), encodings and the offset of its data page within the chunk."""
    if pa.types.is_list(f.type):
        if not values:  # every row an empty list: one level each (repetition 0, definition 0), no values
            body = _levels([(0, n)], 1) + _levels([(0, n)], 2)
            page, size = _page(_DATA_PAGE, n, body)
            return page, size, n, [_PLAIN, _RLE], 0
        total = n * TOKENS
        dict_page, dict_size = _page(_DICTIONARY_PAGE, 1, _plain(f.type.value_type, values[:1]), dictionary=True)
        reps = _levels([run for _ in range(n) for run in ((0, 1), (1, TOKENS - 1))], 1)  # a list starts at 0
        body = reps + _levels([(2, total)], 2) + b"\x01" + _runs([(0, total)], 1)  # all defined, all index 0
        page, size = _page(_DATA_PAGE, total, body, encoding=_RLE_DICTIONARY)
        return dict_page + page, dict_size + size, total, [_PLAIN, _RLE, _RLE_DICTIONARY], len(dict_page)
    if f.nullable and all(v is None for v in values):
        page, size = _page(_DATA_PAGE, n, _levels([(0, n)], 1))
    else:
        levels = _levels([(1, n)], 1) if f.nullable else b""
        page, size = _page(_DATA_PAGE, n, levels + _plain(f.type, values))
    return page, size, n, [_PLAIN, _RLE], 0


def write_bomb(path: str | Path, decoded_bytes: int = 2 << 30, *, worker_id: str = "bomb", step: int = 0,
               policy_version: int = 0, seed: int = 0, env: str = "add", task_ids: Sequence[str] = ("t0",),
               group_size: int = 4, group_prefix: str = "bomb") -> Path:
    """Write rows answering ``task_ids`` in groups of ``group_size`` until they decode to ``decoded_bytes``."""
    path = Path(path)
    n_rows = max(1, -(-decoded_bytes // ROW_BYTES))
    out = bytearray(b"PAR1")
    row_groups = []
    for first in range(0, n_rows, ROWS_PER_GROUP):
        n = min(ROWS_PER_GROUP, n_rows - first)
        k = [((first + i) // group_size) % len(task_ids) for i in range(n)]
        columns = {"worker_id": [worker_id] * n, "step": [step] * n, "policy_version": [policy_version] * n,
                   "task_id": [task_ids[j] for j in k], "env": [env] * n,
                   "group_id": [f"{group_prefix}-{j}" for j in k],
                   "prompt_ids": [7], "completion_ids": [7], "logprobs": [-0.5],
                   **{c: [0.0] * n for c in ("reward", "task_reward", "length_penalty")},
                   "target_length": [None] * n, "temperature": [1.0] * n, "finished": [False] * n,
                   "seed": [seed] * n, "proofs": [], "completion_mask": [1]}
        chunks, total = [], 0
        for f in SCHEMA:
            start = len(out)
            data, size, n_values, encodings, data_at = _column(f, columns[f.name], n)
            out += data
            total += size
            path_in_schema = [f.name, "list", "element"] if pa.types.is_list(f.type) else [f.name]
            physical = _PHYSICAL[f.type.value_type if pa.types.is_list(f.type) else f.type][0]
            meta = [(1, "i32", physical), (2, "list:i32", encodings), (3, "list:bin", path_in_schema),
                    (4, "i32", _ZSTD), (5, "i64", n_values), (6, "i64", size), (7, "i64", len(data)),
                    (9, "i64", start + data_at), (11, "i64", start if data_at else None)]
            chunks.append([(2, "i64", start), (3, "struct", meta)])
        row_groups.append([(1, "list:struct", chunks), (2, "i64", total), (3, "i64", n)])
    arrow_schema = base64.b64encode(SCHEMA.serialize().to_pybytes())
    footer = _struct([(1, "i32", 1), (2, "list:struct", _schema_elements()), (3, "i64", n_rows),
                      (4, "list:struct", row_groups),
                      (5, "list:struct", [[(1, "bin", "ARROW:schema"), (2, "bin", arrow_schema)]]),
                      (6, "bin", "swarmrl.attacks.bomb")])
    out += footer + struct.pack("<i", len(footer)) + b"PAR1"
    path.write_bytes(bytes(out))
    return path


__all__ = ["ROW_BYTES", "TOKENS", "write_bomb"]
