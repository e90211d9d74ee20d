"""The run directory as the trainer and local workers use it: the paths of ``swarmrl.rundir.RunLayout``, created,
plus the bookkeeping of rollout files (announced groups, deficits, pruning) and the SHARDCAST announcements.

Trainer step n starts from policy version n and produces version n + 1. Every write is atomic (temp name +
rename), so a process killed at any moment leaves only complete files.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from swarmrl.rundir import RunLayout, announced_groups, rollout_file_name, step_of_dir
from swarmrl.rundir.layout import ROLLOUT_FILE
from swarmrl.rundir.policy_versions import PolicyDir, atomic_write_text


class RunDir(RunLayout):
    def __init__(self, root: str | Path) -> None:
        super().__init__(root)
        self.policies = PolicyDir(self.policy)
        for d in (self.policy, self.rollouts, self.metrics):
            d.mkdir(parents=True, exist_ok=True)

    # policies (the layout is ``policy_versions.PolicyDir``'s)
    def latest_version(self) -> int | None:
        return self.policies.latest_version()

    def commit_version(self, v: int, staged: Path) -> Path:
        return self.policies.commit_version(v, staged)

    def staging_dir(self, v: int) -> Path:
        return self.policies.staging_dir(v)

    def prune_versions(self, keep: int) -> None:
        self.policies.prune_versions(keep)

    # rollouts
    def make_step_dir(self, step: int) -> Path:
        d = self.step_dir(step)
        d.mkdir(parents=True, exist_ok=True)
        return d

    def rollout_files(self, step: int) -> list[Path]:
        d = self.step_dir(step)
        if not d.is_dir():
            return []
        return sorted(p for p in d.iterdir() if ROLLOUT_FILE.match(p.name))

    def informative_groups(self, step: int) -> int:
        """Usable groups announced for ``step`` (file names) minus those the trainer found unusable."""
        return sum(announced_groups(p) for p in self.rollout_files(step)) - self.deficit(step)

    def deficit(self, step: int) -> int:
        try:
            return int(self.deficit_file(step).read_text())
        except (FileNotFoundError, ValueError):
            return 0

    def set_deficit(self, step: int, n: int) -> None:
        """The trainer announces that ``n`` announced groups were unusable, so workers make more."""
        self.make_step_dir(step)
        atomic_write_text(self.deficit_file(step), str(n))

    def new_rollout_path(self, step: int, worker_id: str, informative: int) -> Path:
        return self.make_step_dir(step) / rollout_file_name(worker_id, time.time_ns(), informative)

    def prune_rollouts(self, before_step: int) -> int:
        """Delete the rollout directories of the steps before ``before_step``; returns how many went."""
        n = 0
        for d in self.rollouts.glob("step_*"):
            s = step_of_dir(d)
            if s is not None and s < before_step:
                shutil.rmtree(d, ignore_errors=True)
                n += 1
        return n

    # weight distribution (SHARDCAST): where the origin serves and which relays the launcher started
    def announce_origin(self, url: str, public_key: str, base: dict | None = None) -> None:
        """Where the origin serves, its manifest key, and (``base``: ``{"blake3", "bytes"}``) the base model it
        published as version 0."""
        self.shardcast.mkdir(exist_ok=True)
        atomic_write_text(self.origin_file, json.dumps({"url": url, "public_key": public_key, "base": base}))

    def announce_relays(self, urls: list[str]) -> None:
        self.shardcast.mkdir(exist_ok=True)
        atomic_write_text(self.relays_file, json.dumps(urls))

    def forget_servers(self) -> None:
        """A resumed run's announcements name the previous processes' ports: dropped before a trainer starts."""
        self.origin_file.unlink(missing_ok=True)
        self.relays_file.unlink(missing_ok=True)

    def origin(self) -> dict | None:
        got = _read_json(self.origin_file)
        return got if isinstance(got, dict) else None

    def weight_servers(self, explicit: list[str] | None = None) -> tuple[list[str], str] | None:
        """Where policies are downloaded from and the manifest key: ``explicit`` servers, else the relays the
        launcher announced (``relays.json``), else the trainer's origin (``origin.json``); None before the
        origin is up."""
        origin = self.origin()
        if origin is None:
            return None
        relays = _read_json(self.relays_file)
        servers = list(explicit or []) or (list(relays) if isinstance(relays, list) and relays else [origin["url"]])
        return servers, origin["public_key"]

    def is_done(self) -> bool:
        return self.done_flag.exists()


def _read_json(path: Path) -> object | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


__all__ = ["RunDir", "announced_groups"]
