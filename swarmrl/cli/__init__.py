"""The `swarmrl` command line: a thin layer over the components (nothing imports it).

Start-up rule: importing these modules (what `swarmrl --help` and every `swarmrl <group> --help` pay for) must
stay light. Components, their config classes and rich are imported inside the command that needs them, on
lines marked `# lazy: startup`; tests/test_cli_startup.py checks that light commands import no torch,
transformers, aiohttp, fastapi, uvicorn, sqlalchemy, pyarrow or matplotlib, and benchmarks/cli/bench.py
times `swarmrl --help`.
"""

from __future__ import annotations

import gc
import importlib

import typer

from swarmrl.cli import models, train
from swarmrl.cli.errors import SwarmrlGroup, exit_gc_skipped, set_debug

# rich_markup_mode=None everywhere: help text is printed as written ("[positions, hidden]" stays).
app = typer.Typer(help="swarmrl: RL for language models over a decentralized swarm.", no_args_is_help=True,
                  pretty_exceptions_enable=False, cls=SwarmrlGroup, rich_markup_mode=None)


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", envvar="SWARMRL_DEBUG",
                                     help="Show the traceback of an error (by default: one line, see exit codes "
                                          "in swarmrl/cli/errors.py).")) -> None:
    set_debug(debug)
    gc.enable()  # paused by `main` for the parse only (a command may pause it again: common.short_command)


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
    # The collector sleeps through the command line's parse (imports and typer's parameter adapters make few
    # cycles; ~10 ms of collections saved) and wakes in `_root`, before any command runs; objects made so far
    # (imported modules) are moved out of its way for good (gc.freeze).
    gc.freeze()
    gc.disable()
    try:
        app()
    finally:
        if exit_gc_skipped():  # the command asked for it (errors.skip_exit_gc): done, everything closed
            gc.freeze()
