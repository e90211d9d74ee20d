"""The run directory: the file interface between the trainer and the inference workers.

    run_dir/policy/v000007/         HF model dir of policy version 7 (+ trainer_state.pt)
    run_dir/policy/LATEST           "7": newest complete version (written after the dir rename)
    run_dir/rollouts/step_000009/   rollout files generated for trainer step 9:
        <worker>-<time_ns>-g<informative groups>.parquet
    run_dir/metrics/*.jsonl         trainer and worker metrics
    run_dir/DONE                    written by the trainer when it has finished

Trainer step n starts from policy version n and produces version n + 1. Every write is atomic
(temp name + rename), so a process killed at any moment leaves only complete files.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

_ROLLOUT = re.compile(r"^(?P<worker>[A-Za-z0-9_.-]+)-(?P<t>\d+)-g(?P<g>\d+)\.parquet$")


def announced_groups(path: Path) -> int:
    """Usable groups a rollout file announces in its name (``...-g<groups>.parquet``)."""
    m = _ROLLOUT.match(path.name)
    if m is None:
        raise ValueError(f"{path.name} is not a rollout file name")
    return int(m.group("g"))


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


class RunDir:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.policy = self.root / "policy"
        self.rollouts = self.root / "rollouts"
        self.metrics = self.root / "metrics"
        for d in (self.policy, self.rollouts, self.metrics):
            d.mkdir(parents=True, exist_ok=True)

    # policies
    def version_dir(self, v: int) -> Path:
        return self.policy / f"v{v:06d}"

    def latest_version(self) -> int | None:
        p = self.policy / "LATEST"
        try:
            return int(p.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def commit_version(self, v: int, staged: Path) -> Path:
        """Move a fully written staging dir into place as version ``v`` and point LATEST at it."""
        final = self.version_dir(v)
        if final.exists():  # left by a crash after rename but before LATEST moved
            shutil.rmtree(final)
        os.replace(staged, final)
        atomic_write_text(self.policy / "LATEST", str(v))
        return final

    def staging_dir(self, v: int) -> Path:
        d = self.policy / f".staging-v{v:06d}"
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        return d

    def prune_versions(self, keep: int) -> None:
        latest = self.latest_version()
        if latest is None:
            return
        for d in self.policy.glob("v*"):
            try:
                v = int(d.name[1:])
            except ValueError:
                continue
            if v <= latest - keep:
                shutil.rmtree(d, ignore_errors=True)

    # rollouts
    def step_dir(self, step: int) -> Path:
        d = self.rollouts / f"step_{step:06d}"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def rollout_files(self, step: int) -> list[Path]:
        d = self.rollouts / f"step_{step:06d}"
        if not d.is_dir():
            return []
        return sorted(p for p in d.iterdir() if _ROLLOUT.match(p.name))

    def informative_groups(self, step: int) -> int:
        """Usable groups announced for ``step`` (file names) minus those the trainer found unusable."""
        return sum(announced_groups(p) for p in self.rollout_files(step)) - self.deficit(step)

    def deficit(self, step: int) -> int:
        try:
            return int((self.rollouts / f"step_{step:06d}" / "DEFICIT").read_text())
        except (FileNotFoundError, ValueError):
            return 0

    def set_deficit(self, step: int, n: int) -> None:
        """The trainer announces that ``n`` announced groups were unusable, so workers make more."""
        atomic_write_text(self.step_dir(step) / "DEFICIT", str(n))

    def new_rollout_path(self, step: int, worker_id: str, informative: int) -> Path:
        import time

        return self.step_dir(step) / f"{worker_id}-{time.time_ns()}-g{informative:04d}.parquet"

    def prune_rollouts(self, before_step: int) -> None:
        for d in self.rollouts.glob("step_*"):
            try:
                s = int(d.name[5:])
            except ValueError:
                continue
            if s < before_step:
                shutil.rmtree(d, ignore_errors=True)

    # weight distribution (SHARDCAST)
    @property
    def shardcast(self) -> Path:
        d = self.root / "shardcast"
        d.mkdir(exist_ok=True)
        return d

    def write_json(self, name: str, obj: object) -> None:
        import json

        atomic_write_text(self.shardcast / name, json.dumps(obj))

    def read_json(self, name: str) -> object | None:
        import json

        try:
            return json.loads((self.shardcast / name).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    # lifecycle
    @property
    def done_flag(self) -> Path:
        return self.root / "DONE"

    def is_done(self) -> bool:
        return self.done_flag.exists()
