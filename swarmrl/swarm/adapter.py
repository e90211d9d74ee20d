"""Trainer side of swarm mode: a small process beside the unchanged trainer.

It tells the orchestrator the trainer's step (``set_step(n, n)`` whenever policy version n is
committed), polls ``accepted(m)`` for the steps nodes may be working on (n .. n + async_level) and
downloads each accepted submission into ``run_dir/rollouts/step_m/`` under the ``RunDir`` name
pattern ``s<submission>.<node>-<time_ns>-g<usable groups>.parquet``. ``Trainer.gather`` then works
exactly as in local mode: it only ever sees work the validator accepted (or, with the orchestrator's
``optimistic = true``, work still pending). The submission id in the name makes the adapter
restartable: files already fetched are not fetched again.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from pathlib import Path

from pydantic import Field

from swarmrl.config import StrictModel
from swarmrl.rl.config import RLConfig
from swarmrl.rl.store import RunDir

log = logging.getLogger("swarmrl.swarm.adapter")

_FETCHED = re.compile(r"^s(?P<sid>\d+)\.")


class AdapterConfig(StrictModel):
    orchestrator: str = "http://127.0.0.1:8700"
    key: str = ""  # trainer key (its public key is in the orchestrator's trainer_keys)
    poll_s: float = Field(0.5, gt=0)
    timeout_s: float = Field(30.0, gt=0)
    max_file_bytes: int = Field(64 << 20, gt=0)
    # SHARDCAST origin: publish every committed policy version (as version + 1) and serve it on this port
    shardcast_dir: str = ""  # "" = off (nodes read the run dir)
    shardcast_port: int = Field(0, ge=0, le=65535)


def usable_groups(rows, cfg: RLConfig) -> int:  # noqa: ANN001
    """Groups of this file the trainer's ``select_groups`` would keep (complete, informative if filtering)."""
    from swarmrl.rl.trainer import select_groups

    if not rows:
        return 0
    usable, _ = select_groups([("f", rows)], rows[0].step, cfg)
    return len(usable)


class TrainerAdapter:
    def __init__(self, rl: RLConfig, cfg: AdapterConfig, client=None) -> None:  # noqa: ANN001
        from swarmrl.protocol.client import TrainerClient
        from swarmrl.utils.metrics import MetricsWriter

        self.rl, self.cfg = rl, cfg
        self.run = RunDir(rl.run_dir)
        self.client = client or TrainerClient(cfg.orchestrator, cfg.key, timeout=cfg.timeout_s)
        self.announced = -1
        self.fetched: set[int] = set()
        for d in self.run.rollouts.glob("step_*"):
            for p in d.iterdir():
                m = _FETCHED.match(p.name)
                if m:
                    self.fetched.add(int(m.group("sid")))
        self.metrics = MetricsWriter(self.run.metrics / "adapter.jsonl")
        self.origin = None
        if cfg.shardcast_dir:
            from swarmrl.shardcast import Origin

            self.origin = Origin(cfg.shardcast_dir, keep=rl.keep_versions)
            self.origin.serve(port=cfg.shardcast_port)

    def _publish(self, version: int) -> None:
        from swarmrl.swarm.policy import SHARDCAST_OFFSET

        if self.origin is None or self.origin.last_version >= version + SHARDCAST_OFFSET:
            return
        self.origin.publish_sync(self.run.version_dir(version) / "model.safetensors", version + SHARDCAST_OFFSET)
        self.metrics.write(event="published", version=version)

    def poll_once(self) -> int:
        """One round: announce the step, fetch newly accepted files; returns the number fetched."""
        from swarmrl.protocol.client import ApiError

        latest = self.run.latest_version()
        if latest is None:
            return 0
        if latest != self.announced:
            self._publish(latest)  # weights first, so nodes can fetch the version they are told to use
            try:
                self.client.set_step(latest, latest)
            except ApiError as e:
                if e.status != 409:  # 409: the orchestrator is already there (adapter restart)
                    raise
            self.announced = latest
            self.metrics.write(event="step", step=latest)
        n = 0
        hi = min(latest + self.rl.async_level, self.rl.steps - 1)
        for m in range(latest, hi + 1):
            for it in self.client.accepted(m).items:
                if it.submission_id in self.fetched:
                    continue
                self._fetch(m, it)
                n += 1
        return n

    def _fetch(self, step: int, it) -> None:  # noqa: ANN001
        from swarmrl.protocol.client import ApiError
        from swarmrl.rl.rollouts import RolloutError, read_rollouts

        d = self.run.step_dir(step)
        tmp = d / f".s{it.submission_id}.tmp{os.getpid()}"
        try:
            sha = self.client.download(it.submission_id, tmp, max_bytes=self.cfg.max_file_bytes)
            if sha != it.sha256:
                raise RolloutError("downloaded bytes do not match the submission's hash")
            g = usable_groups(read_rollouts(tmp), self.rl)
        except (ApiError, RolloutError, OSError) as e:
            tmp.unlink(missing_ok=True)
            log.warning("submission %d not used: %s", it.submission_id, e)
            self.fetched.add(it.submission_id)
            self.metrics.write(event="unusable", submission_id=it.submission_id, step=step, reason=str(e)[:300])
            return
        name = f"s{it.submission_id}.{it.node_id[:16]}-{time.time_ns()}-g{g:04d}.parquet"
        os.replace(tmp, d / name)
        self.fetched.add(it.submission_id)
        self.metrics.write(event="fetched", submission_id=it.submission_id, node_id=it.node_id, step=step,
                           status=it.status, rows=it.n_rows, usable_groups=g)

    def run_forever(self, stop: threading.Event | None = None) -> None:
        stop = stop or threading.Event()
        try:
            while not stop.is_set() and not self.run.is_done():
                try:
                    got = self.poll_once()
                except Exception as e:  # orchestrator restarting or a hiccup: keep polling
                    log.warning("adapter poll failed: %s", e)
                    got = 0
                if not got:
                    stop.wait(self.cfg.poll_s)
        finally:
            self.metrics.close()
            if self.origin is not None:
                self.origin.close(wait=False)


def run_adapter(rl: RLConfig, cfg: AdapterConfig) -> None:
    TrainerAdapter(rl, cfg).run_forever()
