"""`swarmrl shardcast ...`: origin, publish, relay, fetch, keygen (thin: parse, resolve, call)."""

# No `from __future__ import annotations` here: typer would eval every command's string annotations
# when it builds the command tree, on every start (`swarmrl --help` included).

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from swarmrl.cli.common import ConfigOpt, PrintOpt, SetOpt, check_port, console, fail, opt, resolve, short_command

app = typer.Typer(help="Checkpoint broadcast through a tree of HTTP relays (SHARDCAST layout, signed).",
                  no_args_is_help=True, rich_markup_mode=None)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="shardcast")


def _public_key(spec: str) -> None:
    """Exit 2 with one line unless ``spec`` is an origin public key (64 hex chars, or a file holding them)."""
    from swarmrl.shardcast.signing import load_public_key  # noqa: PLC0415  # lazy: startup

    try:
        load_public_key(spec)
    except (ValueError, OSError) as e:
        fail(f"{e} (--origin-pubkey: the origin's 64-hex-char public key, or its .pub file from "
             "`swarmrl shardcast keygen`)")


def _private_key(path: Path):  # noqa: ANN202
    """The origin private key in ``path``, or exit 2 with one line saying what is wrong with the file."""
    from swarmrl.shardcast.signing import load_private_key  # noqa: PLC0415  # lazy: startup

    try:
        return load_private_key(path)
    except (ValueError, OSError) as e:
        fail(f"{e} (--key: an origin private key file from `swarmrl shardcast keygen`)")


def _where(url: str, host: str) -> str:
    """Where a server listens, for its start line: its URL, or for a wildcard address (0.0.0.0, ::), which names
    no machine, the port on every address."""
    from swarmrl.utils.serving import is_wildcard  # noqa: PLC0415  # lazy: startup

    if is_wildcard(host):
        port = url.rsplit(":", 1)[1]
        return f"port {port} of every address ({host}; others reach it at http://<this machine's name>:{port})"
    return url


@app.command("keygen")
def keygen_cmd(out: Annotated[Path, typer.Option("--out", "-o", help="Private key file; public key goes to FILE.pub")]
               ) -> None:
    """Create an origin Ed25519 key pair."""
    from swarmrl.shardcast.signing import keygen  # noqa: PLC0415  # lazy: startup

    if out.exists():
        fail(f"{out} exists; refusing to overwrite a key (choose another --out or remove it)")
    pub = keygen(out)
    console.print(f"wrote {out} and {out}.pub")
    typer.echo(pub)


@app.command("origin")
def origin_cmd(dir: Annotated[Optional[Path], typer.Option("--dir", help="Origin directory.")] = None,
               port: Annotated[Optional[int], typer.Option("--port", help="Port to listen on (default 8600; 0: any "
                                                           "free port).")] = None,
               host: Annotated[Optional[str], typer.Option("--host", help="Address to listen on (default "
                                                           "127.0.0.1).")] = None,
               key: Annotated[Optional[Path], typer.Option("--key", help="Origin private key (to print its public key).")] = None,
               config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False) -> None:
    """Serve an origin directory (publish into it with `shardcast publish` or the Origin API)."""
    from swarmrl.shardcast.config import OriginConfig  # noqa: PLC0415  # lazy: startup

    cfg = resolve(OriginConfig, config, set_, opt("dir", dir) + opt("port", port) + opt("host", host),
                  print_config)
    check_port(cfg.host, cfg.port)
    if key is not None:
        _private_key(key)
    import asyncio  # noqa: PLC0415  # lazy: startup

    from swarmrl.shardcast.server.shard_server import ShardServer  # noqa: PLC0415  # lazy: startup
    from swarmrl.utils.serving import ConnLimits  # noqa: PLC0415  # lazy: startup

    async def run() -> None:
        srv = ShardServer(cfg.dir, hold_s=cfg.hold_s, limits=ConnLimits.from_config(cfg),
                          max_upload_mbps=cfg.max_upload_mbps)
        await srv.start(cfg.host, cfg.port)
        console.print(f"origin serving {cfg.dir} on {_where(srv.url, cfg.host)}")
        if key is not None:
            from swarmrl.shardcast.signing import public_key_hex  # noqa: PLC0415  # lazy: startup

            console.print(f"origin public key {public_key_hex(_private_key(key))}")
        try:
            await asyncio.Event().wait()
        finally:
            await srv.stop()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass


@app.command("publish")
def publish_cmd(file: Annotated[Path, typer.Argument(help="Checkpoint file (e.g. model.safetensors).")],
                dir: Annotated[Optional[Path], typer.Option("--dir", help="Origin directory.")] = None,
                version: Annotated[Optional[int], typer.Option("--version", help="Version (training step).")] = None,
                key: Annotated[Optional[Path], typer.Option("--key", help="Origin private key file.")] = None,
                keep: Annotated[Optional[int], typer.Option("--keep", help="Versions to keep in the origin "
                                                            "directory; older ones are removed (default 5).")] = None,
                config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False) -> None:
    """Shard, sign and list FILE as a new version in the origin directory."""
    from swarmrl.shardcast.config import PublishConfig  # noqa: PLC0415  # lazy: startup

    cfg = resolve(PublishConfig, config, set_, opt("dir", dir) + opt("version", version) + opt("key", key)
                  + opt("keep", keep), print_config)
    if not file.is_file():
        fail(f"checkpoint file not found: {file} (give the path of an existing file to publish)")
    if cfg.key and Path(cfg.key).exists():
        _private_key(Path(cfg.key))
    from swarmrl.shardcast.server.origin import Origin  # noqa: PLC0415  # lazy: startup

    origin = Origin(cfg.dir, key=cfg.key, keep=cfg.keep, shard_size=cfg.shard_size)
    try:
        res = origin.publish_sync(file, cfg.version, move=cfg.move)
    except (ValueError, FileNotFoundError) as e:  # a reused version number, a file gone meanwhile
        fail(e)
    finally:
        origin.close()
    m = res.manifest
    console.print(f"published v{m.version}: {m.size:,} bytes in {m.num_shards} shards, blake3 {m.blake3} "
                  f"({res.seconds:.2f}s); origin public key {origin.public_key}")


@app.command("relay")
def relay_cmd(upstream: Annotated[Optional[list[str]], typer.Option("--upstream", help="Upstream URL (repeatable).")] = None,
              dir: Annotated[Optional[Path], typer.Option("--dir", help="Relay directory (mirrored versions).")] = None,
              port: Annotated[Optional[int], typer.Option("--port", help="Port to listen on (default 8601; 0: any "
                                                          "free port).")] = None,
              origin_pubkey: Annotated[Optional[str], typer.Option("--origin-pubkey", help="Hex key or file.")] = None,
              config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False) -> None:
    """Mirror signed versions from upstream servers and serve them (pipelined)."""
    from swarmrl.shardcast.config import RelayConfig  # noqa: PLC0415  # lazy: startup

    cfg = resolve(RelayConfig, config, set_, opt("upstream", upstream) + opt("dir", dir) + opt("port", port)
                  + opt("origin_pubkey", origin_pubkey), print_config)
    _public_key(cfg.origin_pubkey)
    check_port(cfg.host, cfg.port)
    import asyncio  # noqa: PLC0415  # lazy: startup

    from swarmrl.shardcast.server.relay import Relay, UpstreamWatch  # noqa: PLC0415  # lazy: startup
    from swarmrl.shardcast.server.shard_server import Serving  # noqa: PLC0415  # lazy: startup
    from swarmrl.utils.serving import ConnLimits  # noqa: PLC0415  # lazy: startup

    async def run() -> None:
        relay = Relay(cfg.dir, cfg.upstream, cfg.origin_pubkey, keep=cfg.keep,
                      upstream_options=cfg.upstream_options(),
                      watch=UpstreamWatch(poll_s=cfg.poll_s, longpoll_s=cfg.longpoll_s),
                      serving=Serving(hold_s=cfg.hold_s, limits=ConnLimits.from_config(cfg),
                                      max_upload_mbps=cfg.max_upload_mbps),
                      metrics=cfg.metrics)
        url = await relay.start(cfg.host, cfg.port)
        console.print(f"relay serving {cfg.dir} on {_where(url, cfg.host)}, upstreams {cfg.upstream}")
        try:
            await asyncio.Event().wait()
        finally:
            await relay.stop()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass


@app.command("fetch")
@short_command  # the fetch closes its files, sockets and threads
def fetch_cmd(server: Annotated[Optional[list[str]], typer.Option("--server", help="Server URL (repeatable).")] = None,
              out: Annotated[Optional[Path], typer.Option("--out", "-o", help="File to write the version to.")] = None,
              version: Annotated[Optional[str], typer.Option("--version", help="N or 'latest'.")] = None,
              origin_pubkey: Annotated[Optional[str], typer.Option("--origin-pubkey", help="Hex key or file.")] = None,
              wait: Annotated[Optional[float], typer.Option("--wait", help="Seconds to wait for the version.")] = None,
              insecure: Annotated[bool, typer.Option("--insecure", help="Also read a plain SHARDCAST 0.3.x server "
                                                     "(no signed manifest): only the whole-file checksum listed by "
                                                     "that same untrusted server is checked.")] = False,
              config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False) -> None:
    """Fetch and verify one version into --out. Server URLs may be host:port (http:// is assumed)."""
    from swarmrl.shardcast.client.config import FetchConfig  # noqa: PLC0415  # lazy: startup

    if version is not None and not (version.isdigit() or version == "latest"):
        fail(f"--version {version!r}: expected a version number (e.g. 12, no 'v') or 'latest'")
    cfg = resolve(FetchConfig, config, set_, opt("server", server) + opt("out", out) + opt("version", version)
                  + opt("origin_pubkey", origin_pubkey) + opt("wait_s", wait) + opt("insecure", insecure or None),
                  print_config)
    if cfg.origin_pubkey is not None:
        _public_key(cfg.origin_pubkey)
    if cfg.insecure:
        typer.echo("WARNING: --insecure: a version without a signed manifest (SHARDCAST 0.3.x server) is accepted "
                   "on its whole-file checksum alone, which the same untrusted server supplies.", err=True)
    from swarmrl.shardcast.client.fetch import FetchError, fetch  # noqa: PLC0415  # lazy: startup

    kwargs = {"version": cfg.version, "options": cfg.options()}
    try:
        if sys.stderr.isatty():  # a progress bar on a terminal only (rich is loaded for it, and only then)
            from rich.progress import Progress  # noqa: PLC0415  # lazy: startup (a terminal only)

            with Progress(console=console, transient=True) as prog:
                task = prog.add_task("fetching", total=None)

                def on_shard(done: int, total: int) -> None:
                    prog.update(task, completed=done, total=total)

                res = fetch(cfg.server, cfg.out, cfg.origin_pubkey, on_shard=on_shard, **kwargs)
        else:  # piped or logged: nothing but the result line (or the error line)
            res = fetch(cfg.server, cfg.out, cfg.origin_pubkey, **kwargs)
    except (FetchError, ValueError) as e:
        fail(e, 1, prefix="fetch failed")
    # plain lines (no rich): they are the command's output, printed whole whatever the terminal's width
    typer.echo(f"v{res.version} -> {res.path}: {res.size:,} bytes, blake3 {res.blake3}, {res.seconds:.2f}s "
               f"({res.mb_per_s:.1f} MB/s)" + ("" if res.signed else " UNSIGNED (checksum from the server only)"),
               err=True)
    for url, why in res.excluded.items():
        typer.echo(f"  excluded {url}: {why}", err=True)
    if cfg.metrics:
        from swarmrl.utils.metrics import MetricsWriter  # noqa: PLC0415  # lazy: startup

        with MetricsWriter(cfg.metrics) as mw:
            mw.write(event="fetch", version=res.version, size=res.size, seconds=res.seconds, mb_per_s=res.mb_per_s,
                     bytes_by_server=res.bytes_by_server, excluded=res.excluded)
