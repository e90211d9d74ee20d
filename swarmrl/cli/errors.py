"""How the ``swarmrl`` command line fails: one line on stderr, ``error: WHAT (WHAT TO DO)``, and an exit code.

Exit codes (every command):

- 0: done;
- 1: the command ran and its work failed: a fetch that found no version whose signed manifest verifies, a
  verification that found bad rows or chunks, a role of ``swarmrl run`` that crashed, an unexpected error;
- 2: a usage error: the command line or what it names is wrong, and the user can fix it there: an unknown or
  malformed option or value (click's usage errors), a config that does not validate, a file named on the
  command line that is missing or unreadable (keys included), a malformed public key, a port already in use,
  a missing inference backend;
- 3: a node refused by the orchestrator (registration refused, ejected); 130: interrupted.

No traceback is shown unless ``swarmrl --debug COMMAND ...`` (or ``SWARMRL_DEBUG=1``; ``swarmrl run`` sets it
for its role processes so their logs keep the traceback). Light on purpose: imported by ``swarmrl --help``.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

try:  # typer vendors click (typer._click) since 0.2x; its exceptions are not click's
    from typer._click import exceptions as _cx
except ImportError:  # pragma: no cover
    from click import exceptions as _cx  # type: ignore[no-redef]

_ABORT = tuple({typer.Abort, getattr(_cx, "Abort", typer.Abort)})

USAGE = 2
FAILED = 1

_debug = False
_skip_exit_gc = False


def set_debug(on: bool) -> None:
    global _debug
    _debug = on


def skip_exit_gc() -> None:
    """Called by a short command once it has finished and closed everything it opened: ``main`` then freezes the
    garbage collector (``gc.freeze``) before the interpreter exits, which spares the exit's full collection over
    every object the imports made (~30 ms with typer and pydantic loaded). Only in the ``swarmrl`` process itself;
    an in-process caller (tests, ``CliRunner``) is not affected."""
    global _skip_exit_gc
    _skip_exit_gc = True


def exit_gc_skipped() -> bool:
    return _skip_exit_gc


def debug() -> bool:
    return _debug or os.environ.get("SWARMRL_DEBUG", "") not in ("", "0")


def one_line(msg: object) -> str:
    """``msg`` on one line: a multi-line message (a config error lists one field per line) joined with '; '."""
    lines = [ln.strip() for ln in str(msg).splitlines() if ln.strip()]
    out = lines[0] if lines else ""
    for ln in lines[1:]:
        out += (" " if out.endswith(":") else "; ") + ln
    return out


def say(msg: object, prefix: str = "error") -> None:
    """One plain line on stderr (no rich markup: ``[...]`` in a message is printed as is)."""
    typer.echo(f"{prefix}: {one_line(msg)}", err=True)


def fail(msg: object, code: int = USAGE, prefix: str = "error") -> NoReturn:
    """Print ``error: MSG`` as one line on stderr and end the command with ``code`` (2: usage, 1: failed)."""
    say(msg, prefix)
    raise typer.Exit(code)


def check_port(host: str, port: int | None, option: str = "--port") -> None:
    """Exit 2 with one line if ``host:port`` cannot be listened on (in use, or not an address of this machine),
    before a server starts and fails with a traceback. Port 0 (any free port) is always fine."""
    if not port:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        fail(f"cannot listen on {host}: {e.strerror or e} (give a local address or name, e.g. 127.0.0.1)")
    family, kind, proto, _, addr = infos[0]
    s = socket.socket(family, kind, proto)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn and aiohttp do
        s.bind(addr)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            fail(f"port {port} on {host} is in use (another server, or an earlier one still running): stop it or "
                 f"choose another {option}")
        if e.errno in (errno.EACCES, errno.EPERM):
            fail(f"port {port} on {host}: permission denied (ports below 1024 need privileges): choose another "
                 f"{option}")
        fail(f"cannot listen on {host} port {port}: {e.strerror or e}")
    finally:
        s.close()


def _describe(e: BaseException) -> tuple[int, str]:
    """Exit code and one-line message for an exception no command turned into a message of its own."""
    if isinstance(e, OSError) and e.errno == errno.EADDRINUSE:
        return USAGE, f"{e.strerror or e}: {e} (stop the other server or choose another port)"
    text = one_line(e) or "(no message)"
    if type(e).__module__.startswith("httpx") and type(e).__name__ in ("ConnectError", "ConnectTimeout"):
        try:
            url = str(e.request.url)  # type: ignore[attr-defined]
        except (AttributeError, RuntimeError):
            url = "the server"
        return FAILED, f"cannot reach {url}: {text} (is it running? check the URL option)"
    return FAILED, f"{type(e).__name__}: {text} (run `swarmrl --debug ...` to see the traceback)"


def _usage_line(e: _cx.ClickException) -> str:
    msg = one_line(e.format_message())
    ctx = getattr(e, "ctx", None)
    if ctx is not None:
        msg += f" (see `{ctx.command_path} --help`)"
    return msg


class SwarmrlGroup(TyperGroup):
    """The root command group: every error ends as one line on stderr with its exit code (see module doc)."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        set_debug(False)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _cx.NoArgsIsHelpError as e:  # a bare group: its help, as before
            e.show()
            sys.exit(e.exit_code)
        except _cx.ClickException as e:  # usage errors (2), click's file errors (1)
            say(_usage_line(e))
            sys.exit(e.exit_code)
        except _ABORT:
            say("aborted")
            sys.exit(FAILED)
        except Exception as e:
            if debug():
                raise
            code, msg = _describe(e)
            say(msg)
            sys.exit(code)
        sys.exit(rv if isinstance(rv, int) else 0)
