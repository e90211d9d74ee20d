"""Options every command shares: --config FILE, --set key=value (repeatable), --print-config.

Importing this module (and every ``swarmrl.cli`` module) stays light: ``swarmrl --help`` must not pay for
pydantic, the config loader or a rich Console. Those load on first use.
"""

from __future__ import annotations

import functools
import gc
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional, TypeVar

import typer

from swarmrl.cli.errors import check_port, fail, say, skip_exit_gc  # noqa: F401  (re-exported for the command modules)

if TYPE_CHECKING:
    from pydantic import BaseModel
    from rich.console import Console

T = TypeVar("T", bound="BaseModel")
F = TypeVar("F", bound=Callable[..., Any])

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="TOML config file (see configs/).")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", "-s", help="Override a field: key.sub=value (repeatable).")]
PrintOpt = Annotated[bool, typer.Option("--print-config", help="Print the resolved config as TOML and exit.")]


class _LazyConsole:
    """Stands in for ``rich.console.Console(stderr=True)``, made on first attribute access."""

    __slots__ = ("_console",)

    def __init__(self) -> None:
        self._console: Console | None = None

    def get(self) -> Console:
        if self._console is None:
            from rich.console import Console  # noqa: PLC0415  # lazy: startup

            self._console = Console(stderr=True, markup=False)  # text is printed as is: "[...]" stays
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.get(), name)

    def __enter__(self) -> Console:
        return self.get().__enter__()

    def __exit__(self, *exc: object) -> None:
        self.get().__exit__(*exc)


console: Console = _LazyConsole()  # type: ignore[assignment]


def resolve(model: type[T], config: Path | None, sets: list[str] | None, extra: list[str] | None = None,
            print_config: bool = False, from_run: Callable[[Any], dict[str, Any]] | None = None) -> T:
    """Load a command's config; exits with status 2 and one line naming the field on error.

    ``from_run``: the command also takes the run config of ``swarmrl run`` (``swarmrl.job.commands``): when
    ``config`` is one (some of its top-level keys are ``RunConfig``'s, none is the command's own), it is validated
    as a run config (its errors name its fields) and ``from_run(run)`` gives the command's settings, under
    ``extra`` and ``sets`` (which name the command's own fields, as ``--print-config`` shows them)."""
    from swarmrl.config import ConfigError, dump_config, load_config, read_toml_keys  # noqa: PLC0415  # lazy: startup

    overrides = (extra or []) + (sets or [])
    try:
        cfg = None
        if config is not None and from_run is not None:
            keys, own = read_toml_keys(config), set(model.model_fields)
            if keys and not keys & own:
                from swarmrl.job.config import RunConfig  # noqa: PLC0415  # lazy: startup

                if keys & (set(RunConfig.model_fields) - own):
                    run = load_config(RunConfig, config)
                    cfg = load_config(model, None, overrides, base=from_run(run),
                                      base_source=f"{config} as a run config")
        if cfg is None:
            cfg = load_config(model, config, overrides)
    except ConfigError as e:
        fail(e)
    if print_config:
        typer.echo(dump_config(cfg))
        raise typer.Exit(0)
    return cfg


def require_model_dir(path: str | Path, hint: str = "") -> None:
    """Exit 2 with one line unless ``path`` is a model directory: a missing one is said to be missing (transformers
    would take the path for a hub repo id and complain about its form), one without ``config.json`` is not a model.
    ``hint``: what the option accepts, appended in parentheses."""
    p = Path(path)
    tail = f" ({hint})" if hint else ""
    if not p.exists():
        fail(f"model directory {p} does not exist{tail}")
    if not (p / "config.json").is_file():
        fail(f"{p} is not a Hugging Face model directory (no config.json){tail}")


def short_command(fn: F) -> F:
    """For a command that runs briefly and closes everything it opens (``shardcast fetch``): the garbage collector
    is paused while it runs (its imports and its work make few reference cycles; the collections cost ~10 ms) and,
    once it has succeeded, the ``swarmrl`` process exits without the final collection (``errors.skip_exit_gc``)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        was = gc.isenabled()
        gc.disable()
        try:
            rv = fn(*args, **kwargs)
        finally:
            if was:
                gc.enable()
        skip_exit_gc()
        return rv

    return wrapper  # type: ignore[return-value]


def opt(name: str, value: object) -> list[str]:
    """A convenience CLI flag turned into an override (None means not given)."""
    if value is None:
        return []
    return [f"{name}={json.dumps(str(value)) if isinstance(value, (str, Path)) else json.dumps(value)}"]


@contextmanager
def backend_errors() -> Iterator[None]:
    """A missing inference backend (``inference.backend=vllm`` without vLLM) ends the command with its one-line
    install hint and status 2, not a traceback."""
    from swarmrl.inference.config import BackendUnavailable  # noqa: PLC0415  # lazy: startup

    try:
        yield
    except BackendUnavailable as e:
        fail(e)


def require_backend(inference: object) -> None:
    """``BackendUnavailable`` now (no import, just a look-up) when the configured backend's package is missing."""
    import importlib.util  # noqa: PLC0415  # lazy: startup

    from swarmrl.inference.config import VLLM_INSTALL_HINT, BackendUnavailable  # noqa: PLC0415  # lazy: startup

    if getattr(inference, "backend", "ours") == "vllm" and importlib.util.find_spec("vllm") is None:
        raise BackendUnavailable(VLLM_INSTALL_HINT)
