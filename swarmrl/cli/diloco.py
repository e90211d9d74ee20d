"""`swarmrl diloco`: DiLoCo data-parallel training with W workers on loopback (or a `--ddp` baseline)."""

# No `from __future__ import annotations` here: typer would eval every command's string annotations
# when it builds the command tree, on every start (`swarmrl --help` included).

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from swarmrl.cli.common import ConfigOpt, PrintOpt, SetOpt, console, fail, opt, resolve


def diloco(config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False,
           ddp: Annotated[bool, typer.Option("--ddp", help="Baseline: all-reduce gradients every step.")] = False,
           workers: Annotated[Optional[int], typer.Option(help="Number of worker processes.")] = None,
           inner_steps: Annotated[Optional[int], typer.Option("--inner-steps", "-H", help="Inner steps per round.")] = None,
           steps: Annotated[Optional[int], typer.Option(help="Inner steps per worker in total.")] = None,
           backend: Annotated[Optional[str], typer.Option(help="torch (fixed group), hivemind (elastic) or swarm (signed uploads to a judging aggregator; starts an orchestrator and the aggregator).")] = None,
           wire: Annotated[Optional[str], typer.Option(help="All-reduce dtype: fp32, fp16, bf16 or int8 (chunk-scaled).")] = None,
           out: Annotated[Optional[Path], typer.Option(help="Output directory.")] = None) -> None:
    """Train a small LM with DiLoCo (H inner AdamW steps, outer Nesterov on averaged pseudo-gradients).

    Writes OUT/worker{R}.jsonl metrics, OUT/worker{R}.summary.json and OUT/summary.json.
    """
    from swarmrl.diloco.config import DilocoConfig  # noqa: PLC0415  # lazy: startup

    extra = (opt("workers", workers) + opt("inner_steps", inner_steps) + opt("total_steps", steps)
             + opt("backend", backend) + opt("wire", wire) + opt("out", out)
             + (["mode=\"ddp\""] if ddp else [])
             + (["wire=\"fp32\""] if ddp and wire is None else []))  # the baseline: fp32 gradients
    cfg = resolve(DilocoConfig, config, set_, extra, print_config)
    from swarmrl.diloco.launch import WorkerFailed, run  # noqa: PLC0415  # lazy: startup

    def progress(row: dict) -> None:
        msg = f"{cfg.mode} step {row['step']:>6}/{cfg.total_steps}"
        if "loss" in row:
            msg += f"  loss {row['loss']:.4f}"
        if "round" in row:
            msg += f"  round {row['round']} (group {row.get('group_size', '?')})"
        if "eval_loss" in row:
            msg += f"  eval {row['eval_loss']:.4f}"
        console.print(msg, highlight=False)

    try:
        # a hostile worker (benchmarks, demos: trust.adversary) runs as the attack tools' entry, named here
        summary = run(cfg, progress, hostile_entry="swarmrl.attacks.diloco" if cfg.trust.adversary != "none" else None)
    except WorkerFailed as e:
        fail(f"{e}", 1)
    typer.echo(json.dumps({k: v for k, v in summary.items() if k != "evals"}, indent=2))


def register(app: typer.Typer) -> None:
    app.command("diloco")(diloco)
