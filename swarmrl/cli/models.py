"""`swarmrl model ...`"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from swarmrl.cli.common import ConfigOpt, PrintOpt, SetOpt, console, resolve
from swarmrl.models.config import ModelInitConfig

app = typer.Typer(help="Make and inspect models.", no_args_is_help=True)


@app.command("init")
def init(out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write the HF model + tokenizer to.")],
         config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False) -> None:
    """Write a fresh tiny HF-format model (Qwen2 or Llama) with a locally built tokenizer."""
    cfg = resolve(ModelInitConfig, config, set_, print_config=print_config)
    from swarmrl.models.tiny import init_model

    model, tok = init_model(cfg, out)
    n = sum(p.numel() for p in model.parameters())
    console.print(f"wrote {cfg.arch} model with {n:,} parameters and a {len(tok)}-token tokenizer to {out}")
