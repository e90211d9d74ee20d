"""Rollout files: one parquet file per (worker, step) batch, one row per sampled completion.

The schema is the contract between inference workers, the validator and the trainer. Files from
workers are untrusted: ``read_rollouts`` checks size, schema, row count and per-row consistency
before anything is used and raises ``RolloutError`` with a reason otherwise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

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
    pa.field("advantage", pa.float32(), nullable=False),
    pa.field("target_length", pa.int32(), nullable=True),  # thinking budget, null when none
    pa.field("temperature", pa.float32(), nullable=False),
    pa.field("finished", pa.bool_(), nullable=False),  # ended with EOS
    pa.field("seed", pa.int64(), nullable=False),  # task-assignment seed the tasks came from
    pa.field("proofs", pa.list_(pa.binary()), nullable=False),  # TOPLOC proofs (empty list when not made)
])


class RolloutError(ValueError):
    """A rollout file is malformed or violates limits."""


@dataclass
class Rollout:
    worker_id: str
    step: int
    policy_version: int
    task_id: str
    env: str
    group_id: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    reward: float
    task_reward: float
    length_penalty: float
    advantage: float
    target_length: int | None
    temperature: float
    finished: bool
    seed: int
    proofs: list[bytes] = field(default_factory=list)


_NAMES = [f.name for f in fields(Rollout)]
assert _NAMES == SCHEMA.names, "Rollout dataclass and SCHEMA must list the same columns in order"


def to_table(rows: list[Rollout]) -> pa.Table:
    cols = {n: [getattr(r, n) for r in rows] for n in _NAMES}
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


@dataclass(frozen=True)
class RolloutLimits:
    max_bytes: int = 64 * 1024 * 1024
    max_rows: int = 65_536
    max_prompt_tokens: int = 32_768
    max_completion_tokens: int = 32_768
    max_proofs_per_row: int = 4_096
    max_proof_bytes: int = 4_096


def read_rollouts(path: str | Path, limits: RolloutLimits = RolloutLimits()) -> list[Rollout]:
    """Read and validate an (untrusted) rollout file."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as e:
        raise RolloutError(f"cannot read {path}: {e}") from None
    if size > limits.max_bytes:
        raise RolloutError(f"file is {size} bytes, over the {limits.max_bytes}-byte limit")
    try:
        pf = pq.ParquetFile(path)
        if pf.metadata.num_rows > limits.max_rows:
            raise RolloutError(f"{pf.metadata.num_rows} rows, over the {limits.max_rows}-row limit")
        table = pf.read()
    except RolloutError:
        raise
    except Exception as e:  # pyarrow raises many types on corrupt input
        raise RolloutError(f"not a readable parquet file: {type(e).__name__}: {e}") from None
    return rows_from_table(table, limits)


def rows_from_table(table: pa.Table, limits: RolloutLimits = RolloutLimits()) -> list[Rollout]:
    if table.schema.names != SCHEMA.names:
        missing = sorted(set(SCHEMA.names) - set(table.schema.names))
        extra = sorted(set(table.schema.names) - set(SCHEMA.names))
        raise RolloutError(f"schema mismatch: missing columns {missing}, unexpected columns {extra}"
                           if missing or extra else "schema mismatch: columns out of order")
    for want in SCHEMA:
        got = table.schema.field(want.name)
        if not got.type.equals(want.type):
            raise RolloutError(f"column {want.name!r} has type {got.type}, expected {want.type}")
        if not want.nullable and table.column(want.name).null_count:
            raise RolloutError(f"column {want.name!r} has nulls")
    rows = [Rollout(**d) for d in table.to_pylist()]
    for i, r in enumerate(rows):
        where = f"row {i}"
        if not r.prompt_ids or len(r.prompt_ids) > limits.max_prompt_tokens:
            raise RolloutError(f"{where}: prompt length {len(r.prompt_ids)} out of range")
        if not r.completion_ids or len(r.completion_ids) > limits.max_completion_tokens:
            raise RolloutError(f"{where}: completion length {len(r.completion_ids)} out of range")
        if len(r.logprobs) != len(r.completion_ids):
            raise RolloutError(f"{where}: {len(r.logprobs)} logprobs for {len(r.completion_ids)} completion tokens")
        if any(t < 0 for t in r.prompt_ids) or any(t < 0 for t in r.completion_ids):
            raise RolloutError(f"{where}: negative token id")
        if any(not (lp <= 0.0) for lp in r.logprobs):  # also rejects NaN
            raise RolloutError(f"{where}: logprobs must be <= 0 and finite")
        for name in ("reward", "task_reward", "length_penalty", "advantage", "temperature"):
            v = getattr(r, name)
            if v != v or v in (float("inf"), float("-inf")):
                raise RolloutError(f"{where}: {name} is not finite")
        if r.step < 0 or r.policy_version < 0:
            raise RolloutError(f"{where}: negative step or policy version")
        if len(r.proofs) > limits.max_proofs_per_row or any(len(p) > limits.max_proof_bytes for p in r.proofs):
            raise RolloutError(f"{where}: proofs over the size limits")
    return rows
