"""The rollout wire format: one parquet file per (worker, step) batch, one row per sampled completion
(``swarmrl.contract.Rollout``).

The schema is the contract between inference workers, the validator and the trainer. Files from
workers are untrusted: ``read_rollouts`` checks size, schema, row count and per-row consistency
before anything is used and raises ``RolloutError`` with a reason otherwise.

A few kilobytes of zstd parquet can decode to gigabytes (long runs of one value compress to nothing), so
every limit is on the DECODED file (``RolloutLimits``, declared in ``swarmrl.rollouts.limits``) and is checked
before the data it bounds is materialised: the footer's size first, then the metadata (row count, schema, and
the decoded size the column chunks imply: values x width for numbers, dictionary/plain bytes for strings), then
the rows in batches of ``BATCH_ROWS``, each batch's list lengths, string sizes and values checked in Arrow (strings and
proofs read as dictionaries, so repeated values are not expanded) before it becomes Python objects. A limit
that is hit raises ``RolloutTooLarge`` (its ``limit`` names the ``RolloutLimits`` field; the orchestrator
answers 413), anything else malformed ``RolloutError`` (422). Non-finite floats are refused in every float
column (logprobs, rewards, temperature).

A file whose columns are not SCHEMA's is refused, and one an older version wrote is told so: ``completion_mask``
(one 0/1 per completion token, 1: sampled by the model, 0: a multi-turn environment's reply, whose logprob is 0)
came with multi-turn rollouts, so a file without it was written before them; an ``advantage`` column went when
the trainer became the one place advantages are computed (from the rewards, by its loss's rule), so a file with
it was written before that. Neither is guessed at: each is refused with that reason.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import NamedTuple, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from swarmrl.contract import Rollout
from swarmrl.rollouts.limits import RolloutLimits

SCHEMA = pa.schema([
    pa.field("worker_id", pa.string(), nullable=False),
    pa.field("step", pa.int64(), nullable=False),  # trainer step the sample is generated for
    pa.field("policy_version", pa.int64(), nullable=False),  # policy that generated it
    pa.field("task_id", pa.string(), nullable=False),
    pa.field("env", pa.string(), nullable=False),
    pa.field("group_id", pa.string(), nullable=False),
    pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
    pa.field("completion_ids", pa.list_(pa.int32()), nullable=False),
    pa.field("logprobs", pa.list_(pa.float32()), nullable=False),  # inference logprobs, one per completion token
    pa.field("reward", pa.float32(), nullable=False),  # task_reward - length_penalty
    pa.field("task_reward", pa.float32(), nullable=False),
    pa.field("length_penalty", pa.float32(), nullable=False),
    pa.field("target_length", pa.int32(), nullable=True),  # thinking budget, null when none
    pa.field("temperature", pa.float32(), nullable=False),
    pa.field("finished", pa.bool_(), nullable=False),  # ended with EOS
    pa.field("seed", pa.int64(), nullable=False),  # task-assignment seed the tasks came from
    pa.field("proofs", pa.list_(pa.binary()), nullable=False),  # TOPLOC proofs (empty list when not made)
    # one per completion token: 1 sampled by the model, 0 an environment's reply (multi-turn; all 1 otherwise)
    pa.field("completion_mask", pa.list_(pa.int8()), nullable=False),
])
MASK_COLUMN = "completion_mask"  # added with multi-turn rows: files written before it are refused (no guessing)
ADVANTAGE_COLUMN = "advantage"  # dropped when the trainer took advantages over: files still holding it are refused


class RolloutError(ValueError):
    """A rollout file is malformed or violates limits."""


class RolloutTooLarge(RolloutError):
    """A rollout file is over one of the ``RolloutLimits``; ``limit`` is the field's name."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(message)
        self.limit = limit


_NAMES = [f.name for f in fields(Rollout)]
assert _NAMES == SCHEMA.names, "Rollout dataclass and SCHEMA must list the same columns in order"


def to_table(rows: list[Rollout]) -> pa.Table:
    cols = {n: [getattr(r, n) for r in rows] for n in _NAMES}
    cols[MASK_COLUMN] = [r.model_mask() for r in rows]
    return pa.Table.from_pydict(cols, schema=SCHEMA)


def write_rollouts(rows: list[Rollout], path: str | Path) -> Path:
    """Write atomically: a temp file in the same dir, fsync, rename (readers never see half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    pq.write_table(to_table(rows), tmp, compression="zstd")
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


BATCH_ROWS = 256  # rows decoded at a time
_STRINGS = ("worker_id", "task_id", "env", "group_id")
_DICT_COLUMNS = [*_STRINGS, "proofs.list.element"]  # read as dictionaries: a repeated value is stored once
_TOKENS = (("prompt_ids", "prompt", "max_prompt_tokens"), ("completion_ids", "completion", "max_completion_tokens"))
_FLOATS = ("reward", "task_reward", "length_penalty", "temperature")
_WIDTH = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12}  # decoded bytes per value
_COLUMN_WIDTH = {f"{MASK_COLUMN}.list.element": 1}  # int8 values stored as INT32


def read_rollouts(path: str | Path, limits: RolloutLimits = RolloutLimits()) -> list[Rollout]:
    """Read and validate an (untrusted) rollout file, never holding more than the limits allow."""
    return _read_checked(path, limits, _rows)


def check_rollouts(path: str | Path, limits: RolloutLimits = RolloutLimits()) -> list[GroupKey]:
    """Validate an (untrusted) rollout file exactly as ``read_rollouts`` does, returning only each row's
    grouping fields (what the orchestrator needs at upload): the token, logprob and proof columns are checked
    but never turned into Python objects."""
    return _read_checked(path, limits, _keys)


def _read_checked(path: str | Path, limits: RolloutLimits, convert: Callable[[pa.RecordBatch], list[_T]]
                  ) -> list[_T]:
    path = Path(path)
    try:
        pf = _open_checked(path, limits)
        pf = pq.ParquetFile(path, metadata=pf.metadata, read_dictionary=_DICT_COLUMNS)  # the columns exist now
        rows: list[_T] = []
        decoded = 0
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, use_threads=False):
            decoded += _check_batch(batch, limits, len(rows), decoded)
            rows.extend(convert(batch))
            if len(rows) > limits.max_rows:  # the metadata said fewer
                raise RolloutTooLarge("max_rows", f"more rows than its metadata says, over the {limits.max_rows}-row "
                                                  "limit (max_rows)")
    except RolloutError:
        raise
    except Exception as e:  # pyarrow raises many types on corrupt input
        raise RolloutError(f"not a readable parquet file: {type(e).__name__}: {e}") from None
    return rows


_T = TypeVar("_T")


class GroupKey(NamedTuple):
    """The fields of a row that ``swarmrl.contract.GroupRule`` groups and counts by."""

    worker_id: str
    group_id: str
    step: int
    policy_version: int
    reward: float


def read_group_keys(path: str | Path, limits: RolloutLimits = RolloutLimits()) -> list[GroupKey]:
    """The grouping columns of a rollout file whose rows were checked whole elsewhere (``check_rollouts`` by the
    orchestrator at upload; the caller has matched these bytes to that upload's hash): what ``GroupRule`` needs to
    count usable groups, without decoding the token, logprob and proof columns. Size, footer, row count, schema
    and decoded size are still bounded before anything is read."""
    path = Path(path)
    try:
        keys = _keys(_open_checked(path, limits).read(columns=list(GroupKey._fields), use_threads=False))
    except RolloutError:
        raise
    except Exception as e:  # pyarrow raises many types on corrupt input
        raise RolloutError(f"not a readable parquet file: {type(e).__name__}: {e}") from None
    if any(None in k for k in keys):
        raise RolloutError("null values in the grouping columns")
    return keys


def _keys(batch: pa.RecordBatch | pa.Table) -> list[GroupKey]:
    """The grouping fields of a batch (``_check_batch`` checked its types and nulls) or of a table read by
    ``read_group_keys`` (which checks for nulls after)."""
    cols = [batch.column(name).to_pylist() for name in GroupKey._fields]
    return [GroupKey(*vals) for vals in zip(*cols)]


def _rows(batch: pa.RecordBatch) -> list[Rollout]:
    """A checked batch's rows: converted column by column (a third less time than row dicts) and built
    positionally (``_check_batch`` checked the columns are SCHEMA's, in order: the dataclass's fields). An all-ones
    completion mask (a single-turn row) becomes None, the dataclass's form for it."""
    cols = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
    rows = [Rollout(*vals) for vals in zip(*cols)]
    for r in rows:
        if r.completion_mask is not None and all(r.completion_mask):  # single-turn: the in-memory form is None
            r.completion_mask = None
    return rows


def _open_checked(path: Path, limits: RolloutLimits) -> pq.ParquetFile:
    """The file, once its size, footer, row count, schema and the decoded size its metadata implies are within
    ``limits``: nothing of its data is read yet."""
    try:
        size = path.stat().st_size
    except OSError as e:
        raise RolloutError(f"cannot read {path}: {e}") from None
    if size > limits.max_bytes:
        raise RolloutTooLarge("max_bytes", f"file is {size} bytes, over the {limits.max_bytes}-byte limit (max_bytes)")
    _check_footer(path, size, limits)
    pf = pq.ParquetFile(path)
    _check_metadata(pf, limits)
    return pf


def _check_footer(path: Path, size: int, limits: RolloutLimits) -> None:
    """The footer is parsed whole: bound it from the file's last 8 bytes (length + magic) before parsing."""
    if size < 12:
        raise RolloutError(f"not a readable parquet file: {size} bytes")
    with open(path, "rb") as f:
        head = f.read(4)
        f.seek(size - 8)
        tail = f.read(8)
    if head != b"PAR1" or tail[4:] != b"PAR1":
        raise RolloutError("not a readable parquet file: no PAR1 magic at both ends (encrypted or not parquet)")
    n = int.from_bytes(tail[:4], "little")
    if n > size - 12:
        raise RolloutError(f"not a readable parquet file: a {n}-byte footer in a {size}-byte file")
    if n > limits.max_footer_bytes:
        raise RolloutTooLarge("max_footer_bytes", f"parquet footer is {n} bytes, over the "
                                                  f"{limits.max_footer_bytes}-byte limit (max_footer_bytes)")


def _plain(t: pa.DataType) -> pa.DataType:
    """The type a column has in SCHEMA terms (the reader hands strings and proofs back as dictionaries)."""
    if pa.types.is_dictionary(t):
        return t.value_type
    if pa.types.is_list(t) and pa.types.is_dictionary(t.value_type):
        return pa.list_(t.value_type.value_type)
    return t


def _check_schema(schema: pa.Schema) -> None:
    if schema.names != SCHEMA.names:
        missing = sorted(set(SCHEMA.names) - set(schema.names))
        extra = sorted(set(schema.names) - set(SCHEMA.names))
        old = _written_before(missing, extra)
        raise RolloutError(f"schema mismatch: missing columns {missing}, unexpected columns {extra}{old}"
                           if missing or extra else "schema mismatch: columns out of order")
    for want in SCHEMA:
        got = _plain(schema.field(want.name).type)
        if not got.equals(want.type):
            raise RolloutError(f"column {want.name!r} has type {got}, expected {want.type}")


def _written_before(missing: list[str], extra: list[str]) -> str:
    """What a file whose columns differ from SCHEMA's that way was written before, as the refusal's hint."""
    hints = []
    if missing == [MASK_COLUMN]:
        hints.append("a file from before multi-turn rows")
    if extra == [ADVANTAGE_COLUMN]:
        hints.append("a file from before the trainer computed advantages itself (rows no longer carry them)")
    return f" ({'; '.join(hints)}: rewrite it)" if hints else ""


def _check_metadata(pf: pq.ParquetFile, limits: RolloutLimits) -> None:
    """Rows, schema and the decoded size the metadata implies, before any data is read."""
    md = pf.metadata
    n_rows = max(md.num_rows, sum(md.row_group(i).num_rows for i in range(md.num_row_groups)))
    if n_rows > limits.max_rows:
        raise RolloutTooLarge("max_rows", f"{n_rows} rows, over the {limits.max_rows}-row limit (max_rows)")
    _check_schema(pf.schema_arrow)
    decoded = metadata_decoded_bytes(md)
    if decoded > limits.max_decoded_bytes:
        raise RolloutTooLarge("max_decoded_bytes", f"decodes to at least {decoded} bytes (from its metadata), "
                                                   f"over the {limits.max_decoded_bytes}-byte limit "
                                                   "(max_decoded_bytes)")


def metadata_decoded_bytes(md: pq.FileMetaData) -> int:
    """About the least a parquet file decodes to, from its metadata alone: exact for numbers (values x width),
    the stored bytes for strings and binaries (repeated ones may expand further; checked batch by batch)."""
    decoded = 0
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        for j in range(rg.num_columns):
            c = rg.column(j)
            n = max(0, c.num_values)
            width = _COLUMN_WIDTH.get(c.path_in_schema, _WIDTH.get(c.physical_type))
            decoded += n * width if width else max(0, c.total_uncompressed_size) + 4 * n
            if "." in c.path_in_schema:  # a list: one offset per row
                decoded += 4 * max(0, rg.num_rows)
    return decoded


def _first(mask: pa.Array) -> int:
    """Index of the first true value, -1 when none."""
    return pc.index(mask, True).as_py() if len(mask) else -1


def _byte_lengths(arr: pa.Array) -> pa.Array:
    """Length of every value of a string/binary array, without expanding a dictionary's repeated values."""
    if pa.types.is_dictionary(arr.type):
        return pc.take(pc.binary_length(arr.dictionary), arr.indices)
    return pc.binary_length(arr)


def _check_mask(b: pa.RecordBatch, n_comp: pa.Array, row: Callable[[int], str]) -> None:
    """One mask value per completion token, each 0 or 1, the model's tokens logprob'd (environment tokens: 0)."""
    mask = b.column(MASK_COLUMN)
    n_mask = pc.list_value_length(mask)
    i = _first(pc.not_equal(n_mask, n_comp))
    if i >= 0:
        raise RolloutError(f"{row(i)}: {n_mask[i].as_py()} completion_mask values for {n_comp[i].as_py()} "
                           "completion tokens")
    flat = pc.list_flatten(mask)
    j = _first(pc.invert(pc.is_in(flat, pa.array([0, 1], pa.int8()))))
    if j >= 0:
        raise RolloutError(f"{row(pc.list_parent_indices(mask)[j].as_py())}: completion_mask holds "
                           f"{flat[j].as_py()} (only 0 and 1)")
    env_lp = pc.filter(pc.list_flatten(b.column("logprobs")), pc.equal(flat, 0))
    if len(env_lp) and pc.any(pc.not_equal(env_lp, 0.0)).as_py():
        raise RolloutError("a logprob at an environment token (completion_mask 0) is not 0")


def _check_batch(b: pa.RecordBatch, limits: RolloutLimits, first_row: int, decoded_before: int) -> int:
    """Validate one batch in Arrow; returns its decoded size. Raises before anything is expanded or converted."""
    _check_schema(b.schema)  # what was decoded, not only what the metadata announced
    for want in SCHEMA:
        col = b.column(want.name)
        if not want.nullable and col.null_count:
            raise RolloutError(f"column {want.name!r} has nulls")
        if pa.types.is_list(col.type) and pc.list_flatten(col).null_count:
            raise RolloutError(f"column {want.name!r} has null elements")

    def row(i: int) -> str:
        return f"row {first_row + i}"

    # decoded size: numbers as stored, strings and proofs as they would be once expanded
    str_lengths = {name: _byte_lengths(b.column(name)) for name in _STRINGS}
    proofs = b.column("proofs")
    proof_lengths = _byte_lengths(pc.list_flatten(proofs))
    size = 0
    for want in SCHEMA:
        col = b.column(want.name)
        if want.name in str_lengths:
            size += pc.sum(str_lengths[want.name]).as_py() or 0
            size += 4 * len(col)
        elif want.name == "proofs":
            size += (pc.sum(proof_lengths).as_py() or 0) + 4 * len(proof_lengths) + 4 * len(col)
        elif pa.types.is_list(want.type):
            size += pc.list_flatten(col).nbytes + 4 * len(col)
        else:
            size += col.nbytes
    if decoded_before + size > limits.max_decoded_bytes:
        raise RolloutTooLarge("max_decoded_bytes", f"its first {first_row + len(b)} rows decode to "
                              f"{decoded_before + size} bytes, over the {limits.max_decoded_bytes}-byte limit "
                              "(max_decoded_bytes)")
    for name, lengths in str_lengths.items():
        i = _first(pc.greater(lengths, limits.max_string_bytes))
        if i >= 0:
            raise RolloutTooLarge("max_string_bytes", f"{row(i)}: {name} is {lengths[i].as_py()} bytes, over the "
                                                      f"{limits.max_string_bytes}-byte limit (max_string_bytes)")
    # token lists
    for name, what, limit in _TOKENS:
        n = pc.list_value_length(b.column(name))
        i = _first(pc.less(n, 1))
        if i >= 0:
            raise RolloutError(f"{row(i)}: {what} length 0 out of range")
        i = _first(pc.greater(n, getattr(limits, limit)))
        if i >= 0:
            raise RolloutTooLarge(limit, f"{row(i)}: {what} length {n[i].as_py()} out of range: over the "
                                         f"{getattr(limits, limit)}-token limit ({limit})")
    n_lp = pc.list_value_length(b.column("logprobs"))
    n_comp = pc.list_value_length(b.column("completion_ids"))
    i = _first(pc.not_equal(n_lp, n_comp))
    if i >= 0:
        raise RolloutError(f"{row(i)}: {n_lp[i].as_py()} logprobs for {n_comp[i].as_py()} completion tokens")
    _check_mask(b, n_comp, row)
    for name, _, _ in _TOKENS:
        col = b.column(name)
        j = _first(pc.less(pc.list_flatten(col), 0))
        if j >= 0:
            raise RolloutError(f"{row(pc.list_parent_indices(col)[j].as_py())}: negative token id in {name}")
    # numbers from outside: every float finite, logprobs <= 0
    lp = b.column("logprobs")
    flat = pc.list_flatten(lp)
    j = _first(pc.invert(pc.and_(pc.is_finite(flat), pc.less_equal(flat, 0.0))))
    if j >= 0:
        raise RolloutError(f"{row(pc.list_parent_indices(lp)[j].as_py())}: logprobs must be <= 0 and finite "
                           f"(column 'logprobs' holds {flat[j].as_py()})")
    for name in _FLOATS:
        col = b.column(name)
        i = _first(pc.invert(pc.is_finite(col)))
        if i >= 0:
            raise RolloutError(f"{row(i)}: {name} is not finite (column {name!r} holds {col[i].as_py()})")
    i = _first(pc.or_(pc.less(b.column("step"), 0), pc.less(b.column("policy_version"), 0)))
    if i >= 0:
        raise RolloutError(f"{row(i)}: negative step or policy version")
    # proofs
    n_proofs = pc.list_value_length(proofs)
    i = _first(pc.greater(n_proofs, limits.max_proofs_per_row))
    if i >= 0:
        raise RolloutTooLarge("max_proofs_per_row", f"{row(i)}: proofs over the size limits: {n_proofs[i].as_py()} "
                              f"proofs, over the {limits.max_proofs_per_row}-proof limit (max_proofs_per_row)")
    j = _first(pc.greater(proof_lengths, limits.max_proof_bytes))
    if j >= 0:
        raise RolloutTooLarge("max_proof_bytes", f"{row(pc.list_parent_indices(proofs)[j].as_py())}: proofs over "
                              f"the size limits: a proof of {proof_lengths[j].as_py()} bytes, over the "
                              f"{limits.max_proof_bytes}-byte limit (max_proof_bytes)")
    return size
