"""Stats of a local run (``swarmrl run --local``) read from its run directory: the trainer's
``metrics/trainer.jsonl``, each worker's ``metrics/worker-<id>.jsonl``, the newest policy version
(``policy/LATEST``) and the SHARDCAST servers (``shardcast/origin.json``, ``relays.json``). Only the tail of each
file is read, so a long run's files cost a bounded read per request."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from swarmrl.dashboard.schemas import (
    MAX_NODES,
    MAX_POINTS,
    MAX_VERSIONS,
    NodeList,
    NodeStats,
    Overview,
    PolicyStats,
    TrainerCurves,
    VersionCount,
    merge_points,
    point_from_row,
)
from swarmrl.rundir import RunLayout

TAIL_BYTES = 1 << 20  # of each metrics file
IDLE_AFTER_S = 60.0  # a worker with no row for this long is shown idle
MAX_WORKER_FILES = MAX_NODES


def tail_rows(path: Path, max_bytes: int = TAIL_BYTES) -> list[dict[str, Any]]:
    """The JSON rows in the last ``max_bytes`` of a JSONL file (a partial first or last line is skipped)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    lines = data.split(b"\n")
    if size > max_bytes:
        lines = lines[1:]
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class RunDirStats:
    """The stats API of a local run, from its run directory."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.layout = RunLayout(self.root)

    def _trainer_points(self):  # noqa: ANN202
        pts = [p for r in tail_rows(self.layout.trainer_metrics) if (p := point_from_row(r)) is not None]
        return merge_points(pts)

    def latest_version(self) -> int:
        try:
            return int(self.layout.latest_file.read_text().strip())
        except (OSError, ValueError):
            return 0

    def _workers(self, now: float) -> list[NodeStats]:
        out = []
        for f in self.layout.role_metrics_files("worker")[:MAX_WORKER_FILES]:
            rows = [r for r in tail_rows(f, TAIL_BYTES // 4) if "tokens_per_s" in r]
            last = rows[-1] if rows else {}
            seen = last.get("time")
            recent = [r["tokens_per_s"] for r in rows[-5:]]
            out.append(NodeStats(
                node_id=f.stem.removeprefix("worker-"),
                status="active" if isinstance(seen, (int, float)) and now - seen < IDLE_AFTER_S else "idle",
                throughput=round(sum(recent) / len(recent), 1) if recent else None,
                accepted=len(rows), last_seen=seen if isinstance(seen, (int, float)) else None,
                policy_version=last.get("policy_version")))
        out.sort(key=lambda n: (n.status != "active", -(n.throughput or 0.0), n.node_id))
        return out

    def overview(self) -> Overview:
        now = time.time()
        pts = self._trainer_points()
        steps = [p.step for p in pts if p.step is not None]
        workers = self._workers(now)
        return Overview(mode="local", time=now, step=max(steps) + 1 if steps else 0,
                        policy_version=self.latest_version(), nodes=dict(Counter(w.status for w in workers)))

    def nodes(self, limit: int = MAX_NODES) -> NodeList:
        workers = self._workers(time.time())
        return NodeList(total=len(workers), limit=limit, items=workers[:limit])

    def trainer(self, limit: int = 500) -> TrainerCurves:
        pts = self._trainer_points()
        return TrainerCurves(total=len(pts), source="run directory: metrics/trainer.jsonl",
                             points=pts[-min(limit, MAX_POINTS):])

    def policy(self) -> PolicyStats:
        origin = _read_json(self.layout.origin_file)
        relays = _read_json(self.layout.relays_file)
        origin_url = origin.get("url") if isinstance(origin, dict) else None
        servers = [str(u) for u in relays] if isinstance(relays, list) and relays else \
            ([origin_url] if origin_url else [])
        workers = self._workers(time.time())
        spread = Counter(w.policy_version for w in workers if w.policy_version is not None)
        pts = self._trainer_points()
        steps = [p.step for p in pts if p.step is not None]
        return PolicyStats(policy_version=self.latest_version(), step=max(steps) + 1 if steps else 0,
                           servers=servers[:64], origin=origin_url,
                           public_key=str(origin.get("public_key", "")) if isinstance(origin, dict) else "",
                           spread=[VersionCount(version=v, nodes=n) for v, n in
                                   sorted(spread.items(), reverse=True)[:MAX_VERSIONS]],
                           spread_basis="workers by the policy version of their last rollout batch")
