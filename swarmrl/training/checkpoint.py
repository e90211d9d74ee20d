"""A trainer's own state (what it needs besides the weights), saved into a directory and restored on resume: the RL
trainer saves it with every committed version.

``TrainerState`` follows ``torch.distributed.checkpoint``'s ``Stateful`` protocol (``state_dict`` /
``load_state_dict``): the optimizer's state by parameter name (``get_optimizer_state_dict``: under FSDP2 each
rank's shard, so no rank gathers it), the learning-rate schedule, the RNG and the step counters.
``Checkpointer`` saves it into ``<dir>/trainer_state/`` beside a small ``meta.json`` (what the caller passes: the RL
trainer's step, the files it consumed, the step's metrics row; and whether the optimizer has stepped): with several
ranks through
``torch.distributed.checkpoint`` (every rank writes its part; it loads back under DDP or FSDP2 at any world size);
with one rank as one ``torch.save`` file of the same state dict (``state.pt``), since DCP's planning makes a save
~5x slower (``benchmarks/rl/checkpoint.py``), a noticeable share of a small model's step, and one process has
nothing to plan. Either loads under
either: a ``state.pt`` is read whole by every rank, which keeps its shard.
The model's weights are not part of it: they are the version's own ``model.safetensors``, which the trainer
loads as any holder does.

The RL trainer keeps it in its newest version only (``PolicyDir.drop_older_states``): AdamW's is twice the
weights.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from swarmrl.rundir.layout import STATE_DIR
from swarmrl.rundir.policy_versions import atomic_write_text

META_FILE = "meta.json"
SINGLE_FILE = "state.pt"  # a one-rank trainer's state (see the module docstring)


class TrainerState(Stateful):
    """What the trainer needs besides the weights to go on exactly where it stopped."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer,
                 sched: torch.optim.lr_scheduler.LRScheduler) -> None:
        self.model, self.opt, self.sched = model, opt, sched
        self.step = 0  # the committed version (= trainer steps done)
        self.nonfinite_total = 0  # optimizer steps skipped for a non-finite loss or gradient norm, over the run
        self.loading_optimizer: bool | None = None  # while loading: whether the checkpoint holds optimizer state

    @property
    def stepped(self) -> bool:
        """Has the optimizer taken a step (before that it holds no state, and none is saved)."""
        return bool(self.opt.state)

    def state_dict(self) -> dict[str, Any]:
        sd: dict[str, Any] = {"scheduler": self.sched.state_dict(), "rng": torch.get_rng_state(),
                              "step": self.step, "nonfinite_total": self.nonfinite_total}
        # an optimizer that never stepped has no state and none is saved (get_optimizer_state_dict would create one
        # with an lr = 0 step); when loading, the structure to load into is made when the checkpoint has one
        if self.stepped if self.loading_optimizer is None else self.loading_optimizer:
            sd["optimizer"] = get_optimizer_state_dict(self.model, self.opt)
        return sd

    def load_state_dict(self, sd: dict[str, Any], full: bool = False) -> None:
        """``full``: the optimizer state is whole (a one-rank ``state.pt``), not this rank's DCP-loaded shard."""
        if "optimizer" in sd:
            opts = StateDictOptions(full_state_dict=True) if full else None
            set_optimizer_state_dict(self.model, self.opt, sd["optimizer"], options=opts)
        self.sched.load_state_dict(sd["scheduler"])
        torch.set_rng_state(sd["rng"])
        self.step, self.nonfinite_total = int(sd["step"]), int(sd["nonfinite_total"])


class Checkpointer:
    """Saves and loads a ``TrainerState`` in a version directory (every rank calls both)."""

    def __init__(self, rank: int = 0, world: int = 1) -> None:
        self.rank, self.world = rank, world

    def save(self, version_dir: Path, state: TrainerState, meta: dict[str, Any]) -> None:
        d = version_dir / STATE_DIR
        if self.world == 1:
            d.mkdir(parents=True, exist_ok=True)
            torch.save(state.state_dict(), d / SINGLE_FILE)
        else:
            dcp.save({"trainer": state}, checkpoint_id=d)
        if self.rank == 0:
            atomic_write_text(d / META_FILE, json.dumps({**meta, "optimizer": state.stepped}))

    def load(self, version_dir: Path, state: TrainerState) -> dict[str, Any] | None:
        """Restore ``state`` from ``version_dir``; returns its meta (None when the version has no state)."""
        d = version_dir / STATE_DIR
        try:
            meta = json.loads((d / META_FILE).read_text())
        except FileNotFoundError:
            return None
        if (d / SINGLE_FILE).is_file():
            state.load_state_dict(torch.load(d / SINGLE_FILE, weights_only=False), full=True)
            return meta
        state.loading_optimizer = bool(meta["optimizer"])
        try:
            with _quiet():
                dcp.load({"trainer": state}, checkpoint_id=d, no_dist=self.world == 1)
        finally:
            state.loading_optimizer = None
        return meta


def read_saved_state(version_dir: Path) -> dict[str, Any]:
    """A version's saved trainer state as plain tensors and values, without a model or optimizer to load it into
    (inspection and tests): ``{"trainer": {"optimizer": ..., "scheduler": ..., "step": ...}, "meta": {...}}``."""
    d = version_dir / STATE_DIR
    if (d / SINGLE_FILE).is_file():
        state = {"trainer": torch.load(d / SINGLE_FILE, weights_only=False)}
    else:
        with tempfile.TemporaryDirectory() as tmp, _quiet():
            out = Path(tmp) / "state.pt"
            dcp_to_torch_save(d, out)
            state = torch.load(out, weights_only=False)
    state["meta"] = json.loads((d / META_FILE).read_text())
    return state


class _quiet(warnings.catch_warnings):
    """DCP warns that it runs in one process when no process group exists: that is the single-rank trainer."""

    def __enter__(self) -> None:
        super().__enter__()
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
