"""Where everything of a run lives under its directory: the one place that names these paths.

    <root>/policy/                committed policy versions (``policy_versions.PolicyDir``):
        v000007/                  HF model dir of policy version 7 (+ trainer_state/ in the newest only)
        LATEST                    "7": the newest complete version
    <root>/rollouts/step_000009/  rollout files generated for trainer step 9:
        <worker>-<time_ns>-g<usable groups>.parquet   (the adapter: s<id>.<node>-<time_ns>-g<usable>.parquet)
        DEFICIT                   announced usable groups the trainer found unusable (workers make more)
    <root>/metrics/               JSONL: trainer.jsonl, worker-<id>.jsonl, node-<id>.jsonl, flood-/idle-<id>.jsonl
    <root>/shardcast/             origin.json (url, public_key), relays.json (URLs), the origin's files
    <root>/cache/<worker>/        a worker's SHARDCAST downloads
    <root>/DONE                   written by the trainer when it has finished

Only paths and names: nothing is created here (``swarmrl.rundir.writer.RunDir`` creates and writes them). Standard
library only, so the dashboard and every role can read a run directory without importing the trainer.
"""

from __future__ import annotations

import re
from pathlib import Path

POLICY, ROLLOUTS, METRICS, SHARDCAST, CACHE, DONE = "policy", "rollouts", "metrics", "shardcast", "cache", "DONE"
STATE_DIR = "trainer_state"  # in the newest version's directory: the trainer's state (``swarmrl.training.checkpoint``)
# in the newest version's directory, when the published weights are not float32 (``contract.weights.dtype``): the
# trainer's float32 master weights, a model directory it resumes from
MASTER_DIR = "master"
ROLLOUT_FILE = re.compile(r"^(?P<worker>[A-Za-z0-9_.-]+)-(?P<t>\d+)-g(?P<g>\d+)\.parquet$")
_STEP_DIR = re.compile(r"^step_(\d{6,})$")


def announced_groups(path: Path) -> int:
    """Usable groups a rollout file announces in its name (``...-g<groups>.parquet``)."""
    m = ROLLOUT_FILE.match(path.name)
    if m is None:
        raise ValueError(f"{path.name} is not a rollout file name")
    return int(m.group("g"))


def rollout_file_name(worker_id: str, time_ns: int, usable: int) -> str:
    return f"{worker_id}-{time_ns}-g{usable:04d}.parquet"


def step_of_dir(path: Path) -> int | None:
    """The step a ``rollouts/step_NNNNNN`` directory holds, None for any other name."""
    m = _STEP_DIR.match(path.name)
    return int(m.group(1)) if m else None


class RunLayout:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @property
    def policy(self) -> Path:
        return self.root / POLICY

    @property
    def latest_file(self) -> Path:
        return self.policy / "LATEST"

    def version_dir(self, v: int) -> Path:
        return self.policy / f"v{v:06d}"

    def version_template(self) -> str:
        """A version's directory as a ``str.format`` template of ``policy_version`` (the validator's source)."""
        return str(self.policy / "v{policy_version:06d}")

    @property
    def rollouts(self) -> Path:
        return self.root / ROLLOUTS

    def step_dir(self, step: int) -> Path:
        return self.rollouts / f"step_{step:06d}"

    def deficit_file(self, step: int) -> Path:
        return self.step_dir(step) / "DEFICIT"

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def trainer_metrics(self) -> Path:
        return self.metrics / "trainer.jsonl"

    def role_metrics(self, kind: str, name: str) -> Path:
        """A role's metrics file: ``worker``, ``node``, ``flood`` or ``idle`` and its id."""
        return self.metrics / f"{kind}-{name}.jsonl"

    def role_metrics_files(self, kind: str) -> list[Path]:
        return sorted(self.metrics.glob(f"{kind}-*.jsonl"))

    @property
    def shardcast(self) -> Path:
        return self.root / SHARDCAST

    @property
    def origin_file(self) -> Path:
        return self.shardcast / "origin.json"

    @property
    def relays_file(self) -> Path:
        return self.shardcast / "relays.json"

    def cache(self, worker_id: str) -> Path:
        return self.root / CACHE / worker_id

    @property
    def done_flag(self) -> Path:
        return self.root / DONE
