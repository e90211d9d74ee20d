"""Options every command shares: --config FILE, --set key=value (repeatable), --print-config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional, TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console

from swarmrl.config import ConfigError, dump_config, load_config

console = Console(stderr=True)
T = TypeVar("T", bound=BaseModel)

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="TOML config file (see configs/).")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", "-s", help="Override a field: key.sub=value (repeatable).")]
PrintOpt = Annotated[bool, typer.Option("--print-config", help="Print the resolved config as TOML and exit.")]


def resolve(model: type[T], config: Path | None, sets: list[str] | None, extra: list[str] | None = None,
            print_config: bool = False) -> T:
    """Load a command's config; exits with status 2 and a message naming the field on error."""
    try:
        cfg = load_config(model, config, (extra or []) + (sets or []))
    except ConfigError as e:
        console.print(f"[red]error:[/red] {e}", markup=True, highlight=False)
        raise typer.Exit(2) from None
    if print_config:
        typer.echo(dump_config(cfg))
        raise typer.Exit(0)
    return cfg


def opt(name: str, value: object) -> list[str]:
    """A convenience CLI flag turned into an override (None means not given)."""
    if value is None:
        return []
    return [f"{name}={json.dumps(str(value)) if isinstance(value, (str, Path)) else json.dumps(value)}"]
