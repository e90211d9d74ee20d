"""Experiment tracking: the trainer's records and the run's config sent to W&B or trackio as well, so runs can be
laid side by side the way users of the anchors do. Off by default (``rl.tracking.backend = "none"``); the JSONL
files in ``metrics/`` stay the record either way, and a tracker that fails never stops training.

- ``wandb``: ``mode = "offline"`` (the default) writes the run under ``<run_dir>/tracking`` with no network
  (``wandb sync`` uploads it later); ``"online"`` logs to the W&B server. A resumed trainer continues the same
  W&B run (its id is kept in ``<run_dir>/tracking/run_id``).
- ``trackio``: local-first, a SQLite database under ``<run_dir>/tracking`` (``trackio show`` serves it).

Both are optional packages: ``pip install 'swarmrl[tracking]'``.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import Field

from swarmrl.config import StrictModel
from swarmrl.rundir import EvalRecord, StepRecord

log = logging.getLogger("swarmrl.rl.tracking")


class TrackingSection(StrictModel):
    backend: Literal["none", "wandb", "trackio"] = "none"
    project: str = Field("swarmrl", min_length=1, max_length=128)
    run_name: str = Field("", max_length=128)  # "": the run directory's name
    mode: Literal["offline", "online"] = "offline"  # wandb only
    dir: str = ""  # "": <run_dir>/tracking


class Tracker(Protocol):
    def log(self, step: int, values: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class TrackerUnavailable(RuntimeError):
    """The configured backend's package is not installed."""


def numbers(record: StepRecord | EvalRecord) -> dict[str, float]:
    """The numeric fields of a record (what a tracker plots)."""
    out = {}
    for k, v in record.model_dump(exclude={"time", "step", "version"}).items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k if isinstance(record, StepRecord) else f"{record.event}/{k}"] = float(v)
    return out


def make_tracker(cfg: TrackingSection, run_dir: str | Path, config: dict[str, Any]) -> Tracker | None:
    """The tracker ``cfg`` names (None for ``none``); ``TrackerUnavailable`` when its package is missing."""
    if cfg.backend == "none":
        return None
    d = Path(cfg.dir or Path(run_dir) / "tracking")
    d.mkdir(parents=True, exist_ok=True)
    name = cfg.run_name or Path(run_dir).resolve().name
    if cfg.backend == "wandb":
        return _WandB(cfg, d, name, config)
    return _Trackio(cfg, d, name, config)


def _need(module: str):  # noqa: ANN202
    import importlib  # noqa: PLC0415  # lazy: optional packages

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise TrackerUnavailable(f"rl.tracking.backend = {module!r} needs the {module} package, which is not "
                                 f"importable here ({e}); pip install 'swarmrl[tracking]'") from None


class _WandB:
    def __init__(self, cfg: TrackingSection, d: Path, name: str, config: dict[str, Any]) -> None:
        wandb = _need("wandb")
        id_file = d / "run_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:16]
        id_file.write_text(run_id)
        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(project=cfg.project, name=name, id=run_id, resume="allow", dir=str(d), mode=cfg.mode,
                              config=config)

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class _Trackio:
    def __init__(self, cfg: TrackingSection, d: Path, name: str, config: dict[str, Any]) -> None:
        loaded = sys.modules.get("trackio")
        if loaded is not None and Path(str(loaded.TRACKIO_DIR)).resolve() != d.resolve():
            raise TrackerUnavailable(f"trackio was imported in this process before (it writes to "
                                     f"{loaded.TRACKIO_DIR}, fixed at import), not {d}")
        os.environ["TRACKIO_DIR"] = str(d)  # read when trackio is imported: before the import
        self.trackio = _need("trackio")
        self.trackio.init(project=cfg.project, name=name, config=config, resume="allow")

    def log(self, step: int, values: dict[str, float]) -> None:
        self.trackio.log(values, step=step)

    def close(self) -> None:
        self.trackio.finish()


class SafeTracker:
    """A tracker whose failures are logged and then ignore it: tracking never stops training. Around None (no
    backend, or a rank other than 0) it does nothing."""

    def __init__(self, inner: Tracker | None) -> None:
        self.inner: Tracker | None = inner

    def log(self, step: int, values: dict[str, float]) -> None:
        self._call("log", step, values)

    def close(self) -> None:
        self._call("close")
        self.inner = None

    def _call(self, name: str, *args: object) -> None:
        if self.inner is None:
            return
        try:
            getattr(self.inner, name)(*args)
        except Exception:  # noqa: BLE001 - a tracking backend's trouble is not the trainer's
            log.exception("tracker %s failed; tracking is off for the rest of the run", name)
            self.inner = None
