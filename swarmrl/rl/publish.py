"""Where a committed policy version goes besides the run directory: the trainer's ``WeightPublisher``s.

Every version the trainer commits lands in ``run_dir/policy/vN`` first (the checkpoint, which local workers and
validators read directly); then each publisher is handed it. A publisher may work in the background, but
``close`` waits for what it started. A failure is reported through ``on_error`` (the trainer logs it as a
``publish_failed`` event) and never stops training: a worker that misses a version fetches a newer one.

``ShardcastPublisher``: the trainer is the SHARDCAST origin; version N of the policy is SHARDCAST version N
(version 0, the base model, every worker has already); a LoRA run's version is its adapter file
(``swarmrl.models.adapter_file``: one safetensors file, moved exactly as a full model's). Other publishers (an adapter-only or a delta publisher)
implement the same two methods.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Protocol

from swarmrl.models.adapter_file import MODEL_FILE, weights_file
from swarmrl.rundir.writer import RunDir
from swarmrl.shardcast import Origin

ErrorHandler = Callable[[int, BaseException], None]


class WeightPublisher(Protocol):
    def publish(self, version: int, version_dir: Path) -> None:
        """Make committed version ``version`` (its directory, as ``save_pretrained`` wrote it) available."""

    def close(self) -> None:
        """Wait for the publications in flight; the publisher is not used again."""


class ShardcastPublisher:
    """The SHARDCAST origin inside the trainer: serves on ``host``:``port`` (0: any free one) and announces its URL and
    manifest key in the run directory (``shardcast/origin.json``), where the launcher and workers look."""

    def __init__(self, run: RunDir, *, keep: int, shard_size: int, port: int = 0, host: str = "127.0.0.1",
                 on_error: ErrorHandler | None = None) -> None:
        run.shardcast.mkdir(parents=True, exist_ok=True)
        self.origin = Origin(run.shardcast / "origin", key=run.shardcast / "origin.key", keep=keep,
                             shard_size=shard_size, fsync=False)
        self.url = self.origin.serve(port, host)
        run.announce_origin(self.url, self.origin.public_key)
        self.on_error = on_error
        self._pending: list[Future] = []

    def publish(self, version: int, version_dir: Path) -> None:
        """Publish in the background; a version already published (a resumed trainer republishing its newest, in
        case a crash came between commit and publication) or older than the newest published is skipped."""
        o = self.origin
        if version < 1 or version < o.last_version or o.is_published(version):
            return
        self._pending = [f for f in self._pending if not f.done()]
        fut = o.publish(weights_file(version_dir) or version_dir / MODEL_FILE, version)  # a LoRA run's: the adapter
        self._pending.append(fut)
        if self.on_error is not None:
            handler = self.on_error
            fut.add_done_callback(lambda f: handler(version, f.exception()) if f.exception() else None)

    def close(self) -> None:
        for f in self._pending:
            f.exception()  # waits; a failure was reported through on_error
        self._pending = []
