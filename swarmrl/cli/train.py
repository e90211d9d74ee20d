"""`swarmrl sft` and `swarmrl eval`."""

# No `from __future__ import annotations` here: typer would eval every command's string annotations
# when it builds the command tree, on every start (`swarmrl --help` included).

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from swarmrl.cli.common import ConfigOpt, PrintOpt, SetOpt, backend_errors, console, opt, resolve


def sft(config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False,
        model: Annotated[Optional[str], typer.Option(help="Start from this HF model dir (default: fresh tiny model).")] = None,
        task: Annotated[Optional[str], typer.Option(help="Task name (see `swarmrl tasks`).")] = None,
        out: Annotated[Optional[Path], typer.Option(help="Output directory.")] = None,
        minutes: Annotated[Optional[float], typer.Option(help="Training wall-clock budget.")] = None) -> None:
    """Supervised warm start on a task's demonstrations; saves OUT/model and OUT/metrics.jsonl."""
    from swarmrl.sft.config import SFTConfig  # noqa: PLC0415  # lazy: startup

    extra = opt("model", model) + opt("task.name", task) + opt("out", out) + opt("minutes", minutes)
    cfg = resolve(SFTConfig, config, set_, extra, print_config)
    from swarmrl.sft.train import run_sft  # noqa: PLC0415  # lazy: startup

    def progress(row: dict) -> None:
        msg = f"sft step {row['step']:>5}  {row['train_s']:>6.1f}s  loss {row['loss']:.4f}"
        if "heldout_acc" in row:
            msg += f"  held-out acc {row['heldout_acc']:.3f}"
        console.print(msg, highlight=False)

    summary = run_sft(cfg, progress)
    typer.echo(json.dumps(summary, indent=2))


def eval_(config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False,
          model: Annotated[Optional[str], typer.Option(help="HF model dir.")] = None,
          task: Annotated[Optional[str], typer.Option(help="Task name.")] = None,
          n: Annotated[Optional[int], typer.Option(help="Number of held-out tasks.")] = None) -> None:
    """Held-out accuracy (greedy, batched, through the inference backend: --set inference.backend=vllm), as JSON."""
    from swarmrl.eval.config import EvalConfig  # noqa: PLC0415  # lazy: startup

    cfg = resolve(EvalConfig, config, set_, opt("model", model) + opt("task.name", task) + opt("n", n), print_config)
    from swarmrl.eval.heldout import evaluate_path  # noqa: PLC0415  # lazy: startup

    try:
        with backend_errors():
            res = evaluate_path(cfg)
    except FileNotFoundError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
    typer.echo(json.dumps(res))


def tasks() -> None:
    """List the registered tasks."""
    from swarmrl.envs import available_envs  # noqa: PLC0415  # lazy: startup

    for name in available_envs():
        typer.echo(name)
