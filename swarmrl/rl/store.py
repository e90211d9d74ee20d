"""The run directory: the file interface between the trainer and the inference workers.

    run_dir/policy/                 committed policy versions (``swarmrl.policy.PolicyDir``):
        v000007/ (HF model dir of policy version 7, + trainer_state.pt in the newest only), LATEST ("7")
    run_dir/rollouts/step_000009/   rollout files generated for trainer step 9:
        <worker>-<time_ns>-g<informative groups>.parquet
    run_dir/metrics/*.jsonl         trainer and worker metrics
    run_dir/DONE                    written by the trainer when it has finished

Trainer step n starts from policy version n and produces version n + 1. Every write is atomic
(temp name + rename), so a process killed at any moment leaves only complete files.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

from swarmrl.policy.store import PolicyDir, atomic_write_text

_ROLLOUT = re.compile(r"^(?P<worker>[A-Za-z0-9_.-]+)-(?P<t>\d+)-g(?P<g>\d+)\.parquet$")


def announced_groups(path: Path) -> int:
    """Usable groups a rollout file announces in its name (``...-g<groups>.parquet``)."""
    m = _ROLLOUT.match(path.name)
    if m is None:
        raise ValueError(f"{path.name} is not a rollout file name")
    return int(m.group("g"))


class RunDir:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.policy = self.root / "policy"
        self.policies = PolicyDir(self.policy)
        self.rollouts = self.root / "rollouts"
        self.metrics = self.root / "metrics"
        for d in (self.policy, self.rollouts, self.metrics):
            d.mkdir(parents=True, exist_ok=True)

    # policies (the layout is ``swarmrl.policy.PolicyDir``'s)
    def version_dir(self, v: int) -> Path:
        return self.policies.version_dir(v)

    def latest_version(self) -> int | None:
        return self.policies.latest_version()

    def commit_version(self, v: int, staged: Path) -> Path:
        return self.policies.commit_version(v, staged)

    def staging_dir(self, v: int) -> Path:
        return self.policies.staging_dir(v)

    def prune_versions(self, keep: int) -> None:
        self.policies.prune_versions(keep)

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
        atomic_write_text(self.shardcast / name, json.dumps(obj))

    def read_json(self, name: str) -> object | None:
        try:
            return json.loads((self.shardcast / name).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def weight_servers(self, explicit: list[str] | None = None) -> tuple[list[str], str] | None:
        """Where policies are downloaded from and the manifest key: ``explicit`` servers, else the relays the
        launcher announced (``relays.json``), else the trainer's origin (``origin.json``); None before the
        origin is up."""
        origin = self.read_json("origin.json")
        if not isinstance(origin, dict):
            return None
        relays = self.read_json("relays.json")
        servers = list(explicit or []) or (list(relays) if isinstance(relays, list) and relays else [origin["url"]])
        return servers, origin["public_key"]

    # lifecycle
    @property
    def done_flag(self) -> Path:
        return self.root / "DONE"

    def is_done(self) -> bool:
        return self.done_flag.exists()
