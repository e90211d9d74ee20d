"""Where a committed policy version goes besides the run directory: the trainer's ``WeightPublisher``s.

Every version the trainer commits lands in ``run_dir/policy/vN`` first (the checkpoint, which local workers and
validators read directly); then each publisher is handed it. A publisher may work in the background, but
``close`` waits for what it started. A failure is reported through ``on_error`` (the trainer logs it as a
``publish_failed`` event) and never stops training: a worker that misses a version fetches a newer one.

``ShardcastPublisher``: the trainer is the SHARDCAST origin; version N of the policy is SHARDCAST version N
(version 0 is the base model's bundle, ``swarmrl.models.bundle``, published once at start for nodes that join
with nothing on disk, and announced with its hash in ``origin.json``); a LoRA run's version is its adapter file
(``swarmrl.models.adapter_file``: one safetensors file, moved exactly as a full model's).

``DeltaPublisher`` (``contract.weights.encoding = "delta"``): the same origin, but version N of a full fine-tuning
run is published as its difference from version N-1 (``swarmrl.shardcast.delta``) whenever that is worth it, and as
the whole file (a keyframe) otherwise: the first version it publishes, every ``keyframe_every`` versions, when the
delta would not be smaller, or when the deltas since the last keyframe would together outweigh one. Each publication
is a line of ``shardcast/published.jsonl`` (version, kind, bytes, share of elements changed, seconds to encode).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from swarmrl.contract.weights import WeightsRule
from swarmrl.models.adapter_file import MODEL_FILE, weights_file
from swarmrl.models.bundle import write_bundle
from swarmrl.rundir.writer import RunDir
from swarmrl.shardcast import Origin
from swarmrl.shardcast.delta import delta_filename, encode_delta, read_header
from swarmrl.shardcast.layout import BASE_VERSION

ErrorHandler = Callable[[int, BaseException], None]


class WeightPublisher(Protocol):
    def publish(self, version: int, version_dir: Path) -> None:
        """Make committed version ``version`` (its directory, as ``save_pretrained`` wrote it) available."""

    def close(self) -> None:
        """Wait for the publications in flight; the publisher is not used again."""


def publish_base(origin: Origin, model_dir: str | Path) -> tuple[str, int]:
    """Publish ``model_dir`` as version 0, its bundle (``swarmrl.models.bundle``), unless the origin holds a version 0
    already (a resumed trainer); returns version 0's (BLAKE3 hex, size): the run's base model identity."""
    have = origin.base()
    if have is not None:
        return have
    tmp = origin.root / ".base.tar"
    write_bundle(model_dir, tmp)
    try:
        origin.publish(tmp, BASE_VERSION, move=True, filename="model.tar").result()
    except ValueError:  # published meanwhile by another publisher of this directory
        tmp.unlink(missing_ok=True)
    got = origin.base()
    assert got is not None
    return got


class ShardcastPublisher:
    """The SHARDCAST origin inside the trainer: serves on ``host``:``port`` (0: any free one) and announces its URL and
    manifest key in the run directory (``shardcast/origin.json``), where the launcher and workers look."""

    def __init__(self, run: RunDir, *, keep: int, shard_size: int, port: int = 0, host: str = "127.0.0.1",
                 on_error: ErrorHandler | None = None, base_model: str | Path | None = None,
                 public_host: str = "") -> None:
        """``public_host``: the name or address other machines reach the origin at, announced instead of ``host``
        (a wildcard address such as 0.0.0.0 listens everywhere but names no machine)."""
        run.shardcast.mkdir(parents=True, exist_ok=True)
        self.origin = Origin(run.shardcast / "origin", key=run.shardcast / "origin.key", keep=keep,
                             shard_size=shard_size, fsync=False)
        self.url = self.origin.serve(port, host)
        if public_host:  # an IPv6 address goes in brackets
            h = public_host if public_host.startswith("[") or ":" not in public_host else f"[{public_host}]"
            self.url = f"http://{h}:{self.url.rsplit(':', 1)[1]}"
        run.announce_origin(self.url, self.origin.public_key)
        self.on_error = on_error
        self._pending: list[Future] = []
        if base_model is not None:  # version 0: the base model's bundle, for nodes that have nothing on disk
            self._pending.append(self._base_pool.submit(self._publish_base, run, Path(base_model)))

    _base_pool = ThreadPoolExecutor(1, thread_name_prefix="shardcast-base")

    def _publish_base(self, run: RunDir, base_model: Path) -> None:
        try:
            blake3, size = publish_base(self.origin, base_model)
        except Exception as e:  # noqa: BLE001  # nodes with the model on disk still work: reported, not raised
            if self.on_error is not None:
                self.on_error(0, e)
            return
        run.announce_origin(self.url, self.origin.public_key, base={"blake3": blake3, "bytes": size})

    def publish(self, version: int, version_dir: Path) -> None:
        """Publish in the background; a version already published (a resumed trainer republishing its newest, in
        case a crash came between commit and publication) or older than the newest published is skipped."""
        o = self.origin
        if version < 1 or version < o.last_version or o.is_published(version):
            return
        self._pending = [f for f in self._pending if not f.done()]
        fut = self._start(version, version_dir)
        self._pending.append(fut)
        if self.on_error is not None:
            handler = self.on_error
            fut.add_done_callback(lambda f: handler(version, f.exception()) if f.exception() else None)

    def _start(self, version: int, version_dir: Path) -> Future:
        """Start publishing ``version``: its weights file, whole (a LoRA run's: the adapter)."""
        return self.origin.publish(weights_file(version_dir) or version_dir / MODEL_FILE, version)

    def close(self) -> None:
        for f in self._pending:
            f.exception()  # waits; a failure was reported through on_error
        self._pending = []


class DeltaPublisher(ShardcastPublisher):
    """``ShardcastPublisher`` sending full fine-tuning versions as deltas with keyframes (module docstring); a LoRA
    run's adapters go whole, as there."""

    def __init__(self, run: RunDir, *, rule: WeightsRule, **kw: object) -> None:
        super().__init__(run, **kw)  # type: ignore[arg-type]
        self.rule = rule
        self.elem = 2 if rule.dtype == "bfloat16" else 4
        self._prev: tuple[int, bytes] | None = None  # the newest version published and its file's bytes
        self._chain = (0, 0)  # deltas published since the newest keyframe, and their bytes
        self._log = run.shardcast / "published.jsonl"
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="shardcast-delta")  # in version order

    def _start(self, version: int, version_dir: Path) -> Future:
        f = weights_file(version_dir) or version_dir / MODEL_FILE
        if f.name != MODEL_FILE:  # an adapter: whole, as any publisher sends it
            return super()._start(version, version_dir)
        return self._pool.submit(self._publish_one, version, f.read_bytes())  # read now: the version may be pruned

    def _publish_one(self, version: int, data: bytes) -> None:
        t0 = time.perf_counter()
        prev, self._prev = self._prev, None  # until this one is out, the next is a keyframe
        n, nbytes = self._chain
        delta = None
        if prev is not None and prev[0] == version - 1 and n + 1 < self.rule.keyframe_every:
            delta = encode_delta(prev[1], data, elem=self.elem)
            if delta is not None and (len(delta) >= len(data) or nbytes + len(delta) > len(data)):
                delta = None
        encode_s = time.perf_counter() - t0
        staged = self.origin.root / f".publish_v{version}"
        staged.write_bytes(data if delta is None else delta)
        try:
            self.origin.publish_sync(staged, version, move=True,
                                     filename=MODEL_FILE if delta is None else delta_filename(version - 1))
        finally:
            staged.unlink(missing_ok=True)  # moved into place, or refused
        if delta is None:
            self._chain, row = (0, 0), {"kind": "keyframe", "bytes": len(data)}
        else:
            self._chain = (n + 1, nbytes + len(delta))
            row = {"kind": "delta", "bytes": len(delta), "changed_share": round(read_header(delta).share, 6)}
        self._prev = (version, data)
        with self._log.open("a") as fh:
            fh.write(json.dumps({"version": version, **row, "full_bytes": len(data), "encode_s": round(encode_s, 3),
                                 "time": time.time()}) + "\n")
