"""`swarmrl node ...`, `swarmrl orchestrator ...`, `swarmrl validator ...`"""

# No `from __future__ import annotations` here: typer would eval every command's string annotations
# when it builds the command tree, on every start (`swarmrl --help` included).

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from swarmrl.cli.common import ConfigOpt, PrintOpt, SetOpt, backend_errors, check_port, fail, opt, resolve

node_app = typer.Typer(help="Node identity and membership.", no_args_is_help=True, rich_markup_mode=None)
orch_app = typer.Typer(help="The orchestrator service.", no_args_is_help=True, rich_markup_mode=None)
val_app = typer.Typer(help="The validator service.", no_args_is_help=True, rich_markup_mode=None)


def _private_key(path: Path, what: str = "--key"):  # noqa: ANN202
    """The Ed25519 private key in ``path``, or exit 2 with one line saying what is wrong with the file."""
    from swarmrl.protocol.signing import load_private_key  # noqa: PLC0415  # lazy: startup

    try:
        return load_private_key(path)
    except FileNotFoundError:
        fail(f"{what} {path}: no such key file (make one with `swarmrl node keygen --out FILE`)")
    except (ValueError, OSError) as e:
        fail(f"{what} {path}: {e} (a PEM key file from `swarmrl node keygen`)")


def _public_key_hex(text: str, what: str = "--public-key") -> str:
    """``text`` if it is an acceptable Ed25519 public key (64 hex chars), else exit 2 with one line."""
    from swarmrl.utils.keys import public_key_problem  # noqa: PLC0415  # lazy: startup

    t = text.strip().lower()
    try:
        raw = bytes.fromhex(t)
    except ValueError:
        raw = b""
    why = "expected 64 hex characters" if len(t) != 64 or not raw else public_key_problem(raw)
    if why:
        fail(f"{what} {text[:80]!r} is not a valid public key: {why} (see `swarmrl node pubkey --key FILE`)")
    return t


def _logging() -> None:
    import logging  # noqa: PLC0415  # lazy: startup

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")


@node_app.command("keygen")
def keygen(out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the Ed25519 private key (PEM).")]
           ) -> None:
    """Make a node key pair; prints the public key and node id as JSON."""
    from swarmrl.protocol.signing import generate_key, node_id_for, public_key_hex, save_private_key  # noqa: PLC0415  # lazy: startup

    key = generate_key()
    try:
        save_private_key(key, out)
    except FileExistsError as e:
        fail(f"{e}")
    pub = public_key_hex(key)
    typer.echo(json.dumps({"public_key": pub, "node_id": node_id_for(pub), "key_file": str(out)}))


@node_app.command("pubkey")
def pubkey(key: Annotated[Path, typer.Option("--key", "-k", help="Private key file.")]) -> None:
    """Print the public key and node id of a key file."""
    from swarmrl.protocol.signing import node_id_for, public_key_hex  # noqa: PLC0415  # lazy: startup

    pub = public_key_hex(_private_key(key))
    typer.echo(json.dumps({"public_key": pub, "node_id": node_id_for(pub)}))


@node_app.command("run")
def node_run(config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False,
             orchestrator: Annotated[Optional[str], typer.Option(help="Orchestrator URL.")] = None,
             key: Annotated[Optional[Path], typer.Option(help="Node private key file.")] = None,
             rl_config: Annotated[Optional[Path], typer.Option("--rl-config", help="RL config TOML (model, task, "
                                  "sampling): answer assignments. Without it the node only heartbeats.")] = None,
             adversary: Annotated[Optional[str], typer.Option(help="Run as a cheating node (demo): random_model, "
                                  "edit_tokens, forge_rewards, replay, stale_policy, own_tasks, malformed, oversized, "
                                  "wrong_key, bomb, flood, idle_connections.")] = None,
             max_beats: Annotated[int, typer.Option(help="Membership only: stop after this many heartbeats (0: forever).")] = 0
             ) -> None:
    """A swarm node: register with a measured throughput, heartbeat, and answer assignments (load the assigned
    policy version, generate the seeded tasks' rollouts, upload them signed)."""
    from swarmrl.attacks.config import AdversaryConfig  # noqa: PLC0415  # lazy: startup
    from swarmrl.swarm.config import SwarmNodeConfig  # noqa: PLC0415  # lazy: startup

    cfg = resolve(AdversaryConfig if adversary else SwarmNodeConfig, config, set_,
                  opt("orchestrator", orchestrator) + opt("key", key) + opt("rl_config", rl_config)
                  + opt("adversary", adversary), print_config)
    if not cfg.key:
        fail("key: a node key file is required (swarmrl node keygen --out FILE)")
    _private_key(Path(cfg.key))
    _logging()
    if adversary:
        if not cfg.rl_config:
            fail("--adversary needs --rl-config (a cheater answers assignments)")
        from swarmrl.attacks.adversaries import make_adversary  # noqa: PLC0415  # lazy: startup

        with backend_errors():
            code = make_adversary(cfg).run()
        raise typer.Exit(code)
    if cfg.rl_config:
        from swarmrl.swarm.node import run_swarm_node  # noqa: PLC0415  # lazy: startup

        with backend_errors():
            code = run_swarm_node(cfg)
        raise typer.Exit(code)
    from swarmrl.protocol.client import ApiError, NodeClient  # noqa: PLC0415  # lazy: startup
    from swarmrl.protocol.node import ensure_registered, run_node  # noqa: PLC0415  # lazy: startup

    client = NodeClient(cfg.orchestrator, cfg.key, timeout=cfg.timeout_s)
    try:
        ensure_registered(client, cfg.throughput, cfg.stake, {})
    except ApiError as e:  # e.g. no deposit for this key: say why, exit 3 (refused) like a swarm node
        fail(f"registration refused: {e}", 3)

    def show(reply) -> None:  # noqa: ANN001
        typer.echo(json.dumps({"step": reply.step, "policy_version": reply.policy_version,
                               "assignments": [a.assignment_id for a in reply.assignments]}))

    run_node(client, handler=None, max_beats=max_beats, on_reply=show)


@node_app.command("join")
def node_join(url: Annotated[str, typer.Argument(help="The orchestrator's URL (from the operator's join line).")],
              config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False,
              run_key: Annotated[Optional[str], typer.Option("--run-key", help="The orchestrator's key from the "
                                 "join line: a run description signed by another is refused.")] = None,
              key: Annotated[Optional[Path], typer.Option(help="Node key file (made if missing; default "
                                                               "WORK_DIR/node.pem).")] = None,
              work_dir: Annotated[Optional[Path], typer.Option(help="This node's files (key, cache, rollouts, "
                                                                    "metrics).")] = None,
              stake: Annotated[Optional[float], typer.Option(help="Stake to lock (default: the run's minimum).")] = None
              ) -> None:
    """Join a running swarm with its URL alone: read the run's signed description, check this machine (task
    packages, memory), make a key if none, fetch the base model through the swarm (checked against the run's hash),
    register and work."""
    from swarmrl.swarm.config import JoinConfig  # noqa: PLC0415  # lazy: startup

    cfg = resolve(JoinConfig, config, set_, opt("orchestrator", url) + opt("run_key", run_key) + opt("key", key)
                  + opt("work_dir", work_dir) + opt("stake", stake), print_config)
    if cfg.run_key:
        cfg = cfg.model_copy(update={"run_key": _public_key_hex(cfg.run_key, "--run-key")})
    if cfg.key and Path(cfg.key).exists():
        _private_key(Path(cfg.key))
    _logging()
    from swarmrl.swarm.join import JoinRefused, join  # noqa: PLC0415  # lazy: startup

    with backend_errors():
        try:
            code = join(cfg)
        except JoinRefused as e:
            fail(str(e), e.code)
    raise typer.Exit(code)


@node_app.command("status")
def node_status(orchestrator: Annotated[str, typer.Option(help="Orchestrator URL.")] = "http://127.0.0.1:8700",
                key: Annotated[Optional[Path], typer.Option(help="Node private key file.")] = None,
                node_id: Annotated[Optional[str], typer.Option(help="Any node id (instead of --key).")] = None) -> None:
    """A node's status, stake and credits (locked / unlocked) with its ledger rows, as JSON."""
    from swarmrl.protocol.client import ApiError, NodeClient  # noqa: PLC0415  # lazy: startup
    from swarmrl.protocol.signing import generate_key, node_id_for, public_key_hex  # noqa: PLC0415  # lazy: startup

    if node_id is None and key is None:
        fail("give --key or --node-id")
    nid = node_id or node_id_for(public_key_hex(_private_key(key)))
    with NodeClient(orchestrator, generate_key()) as c:  # public endpoint: no signature needed
        try:
            typer.echo(c.ledger(nid).model_dump_json(indent=2))
        except ApiError as e:
            fail(f"{e}", 1)


@orch_app.command("serve")
def serve(config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False,
          port: Annotated[Optional[int], typer.Option(help="Port (127.0.0.1 by default).")] = None,
          database_url: Annotated[Optional[str], typer.Option(help="SQLAlchemy URL (default: SQLite in data_dir).")] = None,
          data_dir: Annotated[Optional[Path], typer.Option(help="State directory (DB, uploads).")] = None) -> None:
    """Run the orchestrator HTTP service (OpenAPI schema at /openapi.json, docs at /docs)."""
    from swarmrl.protocol.config import OrchestratorConfig  # noqa: PLC0415  # lazy: startup

    cfg = resolve(OrchestratorConfig, config, set_,
                  opt("port", port) + opt("database_url", database_url) + opt("data_dir", data_dir), print_config)
    check_port(cfg.host, cfg.port)
    _logging()
    from swarmrl.protocol.orchestrator import serve as run  # noqa: PLC0415  # lazy: startup

    run(cfg)


@orch_app.command("deposit")
def deposit(key: Annotated[Path, typer.Option(help="The stake authority's private key file (its public key is in "
                                               "the orchestrator's stake_authority_keys).")],
            amount: Annotated[float, typer.Option(help="Stake to deposit.")],
            orchestrator: Annotated[str, typer.Option(help="Orchestrator URL.")] = "http://127.0.0.1:8700",
            node_id: Annotated[Optional[str], typer.Option(help="The node to fund (its id)...")] = None,
            public_key: Annotated[Optional[str], typer.Option(help="... or its public key (hex).")] = None,
            note: Annotated[str, typer.Option(help="Recorded with the ledger row.")] = "") -> None:
    """Deposit stake for a node (registered or not yet): it may then lock up to that much when it registers."""
    from swarmrl.protocol.client import ApiError, AuthorityClient  # noqa: PLC0415  # lazy: startup

    if (node_id is None) == (public_key is None):
        fail("give one of --node-id and --public-key")
    if public_key is not None:
        public_key = _public_key_hex(public_key)
    _private_key(key)
    with AuthorityClient(orchestrator, key) as c:
        try:
            typer.echo(c.deposit(amount, node_id=node_id, public_key=public_key, note=note).model_dump_json())
        except ApiError as e:
            fail(f"{e}", 1)


@val_app.command("run")
def validator_run(config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False,
                  orchestrator: Annotated[Optional[str], typer.Option(help="Orchestrator URL.")] = None,
                  key: Annotated[Optional[Path], typer.Option(help="Validator private key file.")] = None,
                  model_dir: Annotated[Optional[Path], typer.Option(help="Policy model dir (tokenizer).")] = None
                  ) -> None:
    """Poll for pending submissions, check them, post signed verdicts."""
    from swarmrl.protocol.config import ValidatorConfig  # noqa: PLC0415  # lazy: startup

    cfg = resolve(ValidatorConfig, config, set_,
                  opt("orchestrator", orchestrator) + opt("key", key) + opt("model_dir", model_dir), print_config)
    if not cfg.key:
        fail("key: the validator's key file is required")
    from swarmrl.protocol.validator import Validator, config_problems  # noqa: PLC0415  # lazy: startup

    problems = config_problems(cfg)
    if problems:  # a check that cannot work would only ever produce internal errors: refuse to start
        fail("; ".join(problems))
    _private_key(Path(cfg.key))
    _logging()
    v = Validator(cfg)
    try:
        v.run()
    except KeyboardInterrupt:
        pass
    typer.echo(json.dumps(v.health()))


def register(app: typer.Typer) -> None:
    app.add_typer(node_app, name="node")
    app.add_typer(orch_app, name="orchestrator")
    app.add_typer(val_app, name="validator")
