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
import sys

import typer

from swarmrl.cli.errors import SwarmrlGroup, exit_gc_skipped, set_debug

# rich_markup_mode=None everywhere: help text is printed as written ("[positions, hidden]" stays).
_app = typer.Typer(help="swarmrl: RL for language models over a decentralized swarm.", no_args_is_help=True,
                   pretty_exceptions_enable=False, cls=SwarmrlGroup, rich_markup_mode=None)


@_app.callback()
def _root(debug: bool = typer.Option(False, "--debug", envvar="SWARMRL_DEBUG",
                                      help="Show the traceback of an error (by default: one line, see exit codes "
                                           "in swarmrl/cli/errors.py).")) -> None:
    set_debug(debug)
    gc.enable()  # paused by `main` for the parse only (a command may pause it again: common.short_command)


# Each top-level name on the command line, and the module swarmrl/cli/<module>.py whose `register(app)` adds it.
# A command line naming one of them imports and builds only that module's commands (typer turns every
# registered command into a click command on each call, and each module imports its own helpers);
# anything else (`swarmrl --help`, a typo, shell completion) registers them all.
# tests/test_cli_startup.py checks this table against what each `register` adds.
COMMANDS: dict[str, str] = {
    "model": "models", "sft": "train", "eval": "train", "tasks": "train",
    "rl": "rl", "run": "rl", "plot": "rl", "filter": "rl",
    "toploc": "toploc", "shardcast": "shardcast",
    "node": "protocol", "orchestrator": "protocol", "validator": "protocol",
    "diloco": "diloco",
}
_registered: set[str] = set()


def _register(modules: list[str]) -> typer.Typer:
    for name in modules:
        if name not in _registered:
            importlib.import_module(f"swarmrl.cli.{name}").register(_app)
            _registered.add(name)
    return _app


def _modules_for(argv: list[str]) -> list[str]:
    """The command modules a command line needs: the one owning its first word, else all of them."""
    first = next((a for a in argv if not a.startswith("-")), None)
    if first in COMMANDS:
        return [COMMANDS[first]]
    return list(dict.fromkeys(COMMANDS.values()))


def __getattr__(name: str) -> typer.Typer:
    if name == "app":  # the whole command tree (tests, embedding): every command module registered
        return _register(_modules_for([]))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    # The collector sleeps through the command line's parse (imports and typer's parameter adapters make few
    # cycles; ~10 ms of collections saved) and wakes in `_root`, before any command runs; objects made so far
    # (imported modules) are moved out of its way for good (gc.freeze).
    gc.freeze()
    gc.disable()
    try:
        _register(_modules_for(sys.argv[1:]))()
    finally:
        if exit_gc_skipped():  # the command asked for it (errors.skip_exit_gc): done, everything closed
            gc.freeze()
