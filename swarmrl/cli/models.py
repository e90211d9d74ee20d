"""`swarmrl model ...`"""

# No `from __future__ import annotations` here: typer would eval every command's string annotations
# when it builds the command tree, on every start (`swarmrl --help` included).

from pathlib import Path
from typing import Annotated

import typer

from swarmrl.cli.common import ConfigOpt, PrintOpt, SetOpt, console, resolve

app = typer.Typer(help="Make and inspect models.", no_args_is_help=True)


@app.command("init")
def init(out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write the HF model + tokenizer to.")],
         config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False) -> None:
    """Write a fresh tiny HF-format model (Qwen2 or Llama) with a locally built tokenizer."""
    from swarmrl.models.config import ModelInitConfig  # noqa: PLC0415  # lazy: startup

    cfg = resolve(ModelInitConfig, config, set_, print_config=print_config)
    from swarmrl.models.tiny import init_model  # noqa: PLC0415  # lazy: startup

    model, tok = init_model(cfg, out)
    n = sum(p.numel() for p in model.parameters())
    console.print(f"wrote {cfg.arch} model with {n:,} parameters and a {len(tok)}-token tokenizer to {out}")
