"""The upload bomb (adversary ``bomb``, ``benchmarks/attacks/bomb.py``): a rollout file of a few kilobytes
whose rows are each of legal shape (32,768 prompt and completion tokens, one logprob per token) and whose
values repeat, so zstd parquet stores them in almost nothing while they decode to gigabytes. It is written
batch by batch from one repeated Arrow batch, so building it never holds more than that batch."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from swarmrl.rollouts.wire import SCHEMA

TOKENS = 32_768  # per prompt and per completion: the most a row may legally hold
ROW_BYTES = TOKENS * 12  # decoded: prompt ids, completion ids (int32) and logprobs (float32)
_BATCH = 64


def _lists(n: int, value: float | int, typ: pa.DataType) -> pa.ListArray:
    offsets = pa.array(np.arange(0, (n + 1) * TOKENS, TOKENS, dtype=np.int32))
    values = pa.array(np.full(n * TOKENS, value, dtype=typ.to_pandas_dtype()), typ)
    return pa.ListArray.from_arrays(offsets, values)


def write_bomb(path: str | Path, decoded_bytes: int = 2 << 30, *, worker_id: str = "bomb", step: int = 0,
               policy_version: int = 0, seed: int = 0, env: str = "add", task_ids: Sequence[str] = ("t0",),
               group_size: int = 4, group_prefix: str = "bomb") -> Path:
    """Write rows answering ``task_ids`` in groups of ``group_size`` until they decode to ``decoded_bytes``."""
    path = Path(path)
    n_rows = max(1, -(-decoded_bytes // ROW_BYTES))
    n = min(_BATCH, n_rows)
    k = [(i // group_size) % len(task_ids) for i in range(n)]
    batch = pa.record_batch({
        "worker_id": pa.array([worker_id] * n), "step": pa.array([step] * n, pa.int64()),
        "policy_version": pa.array([policy_version] * n, pa.int64()),
        "task_id": pa.array([task_ids[j] for j in k]), "env": pa.array([env] * n),
        "group_id": pa.array([f"{group_prefix}-{j}" for j in k]),
        "prompt_ids": _lists(n, 7, pa.int32()), "completion_ids": _lists(n, 7, pa.int32()),
        "logprobs": _lists(n, -0.5, pa.float32()),
        **{c: pa.array([0.0] * n, pa.float32()) for c in ("reward", "task_reward", "length_penalty", "advantage")},
        "target_length": pa.array([None] * n, pa.int32()), "temperature": pa.array([1.0] * n, pa.float32()),
        "finished": pa.array([False] * n), "seed": pa.array([seed] * n, pa.int64()),
        "proofs": pa.array([[]] * n, pa.list_(pa.binary())),
    }, schema=SCHEMA)
    batches = [batch] * (n_rows // n) + ([batch.slice(0, n_rows % n)] if n_rows % n else [])
    # one row group (zero-copy table of the repeated batch): the fewer pages and groups, the smaller the file
    pq.write_table(pa.Table.from_batches(batches, schema=SCHEMA), path, row_group_size=n_rows, compression="zstd")
    return path


__all__ = ["ROW_BYTES", "TOKENS", "write_bomb"]
