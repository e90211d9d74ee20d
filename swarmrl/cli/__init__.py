"""The `swarmrl` command line: a thin layer over the components (nothing imports it).

Start-up rule: importing these modules (what `swarmrl --help` and every `swarmrl <group> --help` pay for) must
stay light. Components, their config classes and rich are imported inside the command that needs them, on
lines marked `# lazy: startup`; tests/test_cli_startup.py checks that light commands import no torch,
transformers, aiohttp, fastapi, uvicorn, sqlalchemy, pyarrow or matplotlib, and benchmarks/cli/bench.py
times `swarmrl --help`.
"""

from __future__ import annotations

import importlib

import typer

from swarmrl.cli import models, train

app = typer.Typer(help="swarmrl: RL for language models over a decentralized swarm.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
app.add_typer(models.app, name="model")
app.command("sft")(train.sft)
app.command("eval")(train.eval_)
app.command("tasks")(train.tasks)

# Component command groups, each in swarmrl/cli/<name>.py exposing `register(app)`.
for _name in ("rl", "toploc", "shardcast", "protocol", "diloco"):
    try:
        _mod = importlib.import_module(f"swarmrl.cli.{_name}")
    except ModuleNotFoundError as _e:
        if _e.name != f"swarmrl.cli.{_name}":
            raise
        continue
    _mod.register(app)


def main() -> None:
    app()
