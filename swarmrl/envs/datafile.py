"""Loading task records from local JSONL or parquet files, with errors that name file and line.

Records follow the INTELLECT-2 dataset style: ``prompt`` (str), ``verification_info`` (a dict, or a
JSON string encoding one), ``task_type`` (str, optional), plus optional ``task_id``/``problem_id``
and ``solution`` (a correct completion, used as the SFT demonstration).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_FILE_BYTES = 512 * 1024 * 1024
MAX_RECORDS = 5_000_000


class DataFileError(ValueError):
    """A task file is missing or malformed; the message names the file and, when known, the line."""


@dataclass(frozen=True)
class Record:
    line: int  # 1-based line (JSONL) or row (parquet)
    task_id: str
    prompt: str
    verification_info: dict[str, Any]
    task_type: str
    solution: str | None


def _coerce(raw: Any, path: Path, line: int, default_task_type: str) -> Record:
    where = f"{path}:{line}"
    if not isinstance(raw, dict):
        raise DataFileError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    prompt = raw.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise DataFileError(f"{where}: field 'prompt' must be a non-empty string")
    vi = raw.get("verification_info")
    if isinstance(vi, str):
        try:
            vi = json.loads(vi)
        except json.JSONDecodeError as e:
            raise DataFileError(f"{where}: field 'verification_info' is a string but not valid JSON ({e})") from None
    if not isinstance(vi, dict):
        raise DataFileError(f"{where}: field 'verification_info' must be an object (or a JSON string of one)")
    task_type = raw.get("task_type") or default_task_type
    if not isinstance(task_type, str):
        raise DataFileError(f"{where}: field 'task_type' must be a string")
    tid = raw.get("task_id", raw.get("problem_id"))
    if tid is None:
        tid = prompt
    if not isinstance(tid, (str, int)):
        raise DataFileError(f"{where}: field 'task_id' must be a string or integer")
    sol = raw.get("solution")
    if sol is not None and not isinstance(sol, str):
        raise DataFileError(f"{where}: field 'solution' must be a string")
    return Record(line=line, task_id=str(tid), prompt=prompt, verification_info=vi, task_type=task_type,
                  solution=sol)


def load_records(path: str | Path, default_task_type: str) -> list[Record]:
    """All records of a ``.jsonl``/``.json`` (one object per line) or ``.parquet`` file."""
    p = Path(path)
    if not p.is_file():
        raise DataFileError(f"{p}: task file not found")
    size = p.stat().st_size
    if size > MAX_FILE_BYTES:
        raise DataFileError(f"{p}: task file is {size} bytes, over the {MAX_FILE_BYTES} byte limit")
    out: list[Record] = []
    if p.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq  # noqa: PLC0415  # lazy: pyarrow

            rows = pq.read_table(p).to_pylist()
        except Exception as e:  # noqa: BLE001 - any reader failure is a malformed file
            raise DataFileError(f"{p}: cannot read parquet file ({e})") from None
        for i, row in enumerate(rows, start=1):
            out.append(_coerce(row, p, i, default_task_type))
    else:
        with p.open("r", encoding="utf-8", errors="strict") as f:
            try:
                for i, text in enumerate(f, start=1):
                    if not text.strip():
                        continue
                    try:
                        raw = json.loads(text)
                    except json.JSONDecodeError as e:
                        raise DataFileError(f"{p}:{i}: invalid JSON ({e.msg} at column {e.colno})") from None
                    out.append(_coerce(raw, p, i, default_task_type))
                    if len(out) > MAX_RECORDS:
                        raise DataFileError(f"{p}: more than {MAX_RECORDS} records")
            except UnicodeDecodeError as e:
                raise DataFileError(f"{p}: not valid UTF-8 ({e})") from None
    if not out:
        raise DataFileError(f"{p}: task file has no records")
    seen: dict[str, int] = {}
    for r in out:
        if r.task_id in seen:
            raise DataFileError(f"{p}:{r.line}: duplicate task id {r.task_id!r} (first at line {seen[r.task_id]})")
        seen[r.task_id] = r.line
    return out


# ---------------------------------------------------------------------------------------------
# File-backed environments: split by hash of the task id, deterministic sampling by seed.

import random  # noqa: E402

from swarmrl.envs.base import Environment, Split, Task, heldout_bucket  # noqa: E402


class FileEnvironment(Environment):
    """Tasks loaded from a file, split into train/held-out by ``heldout_bucket(env:task_id)``.

    ``sample(seed, n, "train")`` draws without replacement while it can (then reshuffles, so
    ``n`` may exceed the pool); ``sample(seed, n, "heldout")`` returns ``min(n, pool)`` distinct
    held-out tasks (never padded with repeats, so an eval's denominator is honest).
    """

    default_task_type = "verifiable"

    def __init__(self, path: str | Path, heldout_pct: float) -> None:
        if not 0 < heldout_pct < 100:
            raise ValueError("heldout_pct must be in (0, 100)")
        self.path = Path(path)
        self.heldout_pct = heldout_pct
        records = load_records(self.path, self.default_task_type)
        self.tasks: list[Task] = []
        for r in records:
            self.check_record(r)
            self.tasks.append(Task(task_id=f"{self.name}:{r.task_id}", env=self.name, prompt=r.prompt,
                                   verification_info=r.verification_info, task_type=r.task_type,
                                   demonstration=r.solution, meta={"source": f"{self.path}:{r.line}"}))
        self._split: dict[str, list[Task]] = {"train": [], "heldout": []}
        for t in self.tasks:
            self._split["heldout" if heldout_bucket(t.task_id, heldout_pct) else "train"].append(t)

    def check_record(self, r: Record) -> None:
        """Validate a record's ``verification_info``; raise DataFileError naming ``r.line``."""

    def split_tasks(self, split: Split) -> list[Task]:
        return list(self._split[split])

    def sample(self, seed: int, n: int, split: Split = "train") -> list[Task]:
        if split not in ("train", "heldout"):
            raise ValueError(f"split must be 'train' or 'heldout', not {split!r}")
        pool = self._split[split]
        if n <= 0:
            return []
        if not pool:
            raise ValueError(f"{self.path}: the {split} split of task {self.name!r} is empty "
                             f"({len(self.tasks)} tasks, heldout_pct={self.heldout_pct})")
        rng = random.Random(f"{self.name}:{split}:{seed}")
        if split == "heldout":
            return rng.sample(pool, min(n, len(pool)))
        out: list[Task] = []
        while len(out) < n:
            out.extend(rng.sample(pool, min(n - len(out), len(pool))))
        return out
