"""The warm start before RL: SFT of a fresh tiny model until it is right some of the time (or reuse one)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from swarmrl.job.commands import sft_settings
from swarmrl.job.config import RunConfig
from swarmrl.sft.config import SFTConfig


def prepare_warmstart(cfg: RunConfig, progress: Callable[[str], None]) -> str:
    model = Path(cfg.rl.model)
    if (model / "config.json").is_file() and cfg.warmstart.reuse:
        progress(f"warm start: reusing {model}")
        return str(model)
    if not cfg.warmstart.enabled:
        raise FileNotFoundError(f"initial model {model} does not exist and warm start is disabled")
    from swarmrl.sft.train import run_sft  # noqa: PLC0415  # lazy: torch, only when a warm start is made

    sft = SFTConfig.model_validate(sft_settings(cfg))  # as `swarmrl sft -c RUN_CONFIG`: the run's task and template
    progress(f"warm start: SFT of a fresh tiny model on {sft.task.name} for {sft.minutes} min")

    def cb(row: dict) -> None:
        if row["step"] % 100 == 0:
            progress(f"  sft step {row['step']}  loss {row['loss']:.3f}")

    summary = run_sft(sft, cb)
    src = Path(summary["model"])
    if src.resolve() != model.resolve():
        if model.exists():
            shutil.rmtree(model)
        model.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, model)
    progress(f"warm start: held-out accuracy {summary['final_heldout_acc']:.3f} after {summary['steps']} steps")
    return str(model)
