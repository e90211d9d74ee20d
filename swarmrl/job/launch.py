"""``swarmrl run``: warm start if needed, derive every role's config from the ``RunConfig``, then supervise
the role processes until the trainer finishes, and report.

- local mode: the trainer (SHARDCAST origin when enabled, with relays under it) and N trusted workers; the
  launcher serves the live dashboard from the run directory's metrics (``swarmrl.dashboard.server``);
- swarm mode (the main job): the orchestrator (SQLite under the run dir; a stake authority key of the run
  deposits each member's stake before the nodes start), the trainer and its adapter,
  relays, the validator, honest nodes and one node per ``--adversary``, each with its own key; the
  orchestrator and relays come back on the same port (and database) if they die, so nothing is lost;
  ejected adversaries stay out. The orchestrator serves the live dashboard (``/dashboard``).

Roles talk only through the run directory and the orchestrator's API; the launcher only starts, watches
and restarts processes and reads their metrics files.
"""

from __future__ import annotations

import json
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from swarmrl.dashboard.server import DashboardServer
from swarmrl.job.config import RunConfig
from swarmrl.job.derive import Identity, Placement, Plan, derive_local, derive_swarm, member_names, relay_roles
from swarmrl.job.report import finish, snapshot, swarm_report
from swarmrl.job.supervisor import RoleFailed, Supervisor
from swarmrl.job.warmstart import prepare_warmstart
from swarmrl.job.zygote import Zygote, preload_modules
from swarmrl.protocol.client import AuthorityClient
from swarmrl.protocol.config import is_loopback
from swarmrl.protocol.signing import node_id_for, public_key_hex
from swarmrl.rundir.writer import RunDir
from swarmrl.utils.keys import load_or_make_private_key
from swarmrl.utils.procs import free_port


def keygen(path: Path) -> Identity:
    """The identity in ``path``: made now, or the one a resumed run already has."""
    pub = public_key_hex(load_or_make_private_key(path))
    return Identity(str(path), pub, node_id_for(pub))


def run_secret(root: Path) -> str:
    """The run's secret (task seeds): made once and kept in the run dir (owner-only), so a resumed run's
    validator re-derives the seeds of work assigned before the restart."""
    path = root / "run_secret"
    if path.exists():
        return path.read_text().strip()
    secret = secrets.token_hex(16)
    path.touch(mode=0o600)
    path.write_text(secret)
    return secret


def wait_for_origin(run: RunDir, trainer: subprocess.Popen, logs: Path, timeout_s: float = 180.0) -> dict:
    """The trainer's SHARDCAST origin (``origin.json``: url, public_key), once it is up."""
    t0 = time.monotonic()
    while True:
        origin = run.origin()
        if origin is not None:
            return origin
        if trainer.poll() is not None:
            raise RuntimeError(f"trainer exited with {trainer.returncode} before its SHARDCAST origin came up; "
                               f"see {logs / 'trainer.log'}")
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError("the trainer's SHARDCAST origin did not come up")
        time.sleep(0.2)


def _plan(cfg: RunConfig, root: Path, place: Placement | None = None) -> Plan:
    origin_port = free_port() if cfg.rl.shardcast.enabled else 0
    if cfg.mode == "local":
        return derive_local(cfg, root, origin_port)
    keys = root / "keys"
    keys.mkdir(exist_ok=True)
    members = {name: keygen(keys / f"{name.split('-')[0]}.pem") for name in member_names(cfg)}
    return derive_swarm(cfg, root, cfg.swarm.port or free_port(), run_secret(root), keygen(keys / "validator.pem"),
                        keygen(keys / "trainer.pem"), members, keygen(keys / "authority.pem"), origin_port, place)


def deposit_stakes(plan: Plan) -> None:
    """Swarm mode, once the orchestrator is up and before any node starts: the run's stake authority deposits each
    member's stake once (a restarted orchestrator keeps them: they are ledger rows; a resumed run does not deposit
    again: ``deposits.json`` in the run dir lists what was deposited)."""
    record = plan.root / "deposits.json"
    done = set(json.loads(record.read_text())) if record.is_file() else set()
    todo = {n: a for n, a in plan.deposits.items() if n not in done}
    if not todo:
        return
    with AuthorityClient(plan.url, plan.authority.key) as c:
        for node_id, amount in todo.items():
            c.deposit(amount, node_id=node_id, note="swarmrl run: member stake")
            done.add(node_id)
            record.write_text(json.dumps(sorted(done)))


def launch(cfg: RunConfig, progress: Callable[[str], None] = print, live: Callable[[dict], None] | None = None) -> dict:
    """Run the whole job; returns a summary dict. Under a network profile (``cfg.wan``) the harness is refused
    first (``swarmrl.wan.netns.WanUnavailable``) where this process lacks the rights."""
    if cfg.wan.profile:
        from swarmrl.wan.netns import check_rights  # noqa: PLC0415  # lazy: only runs under a network profile

        check_rights()
    prepare_warmstart(cfg, progress)
    root = Path(cfg.rl.run_dir)
    if cfg.fresh and root.exists():
        shutil.rmtree(root)
    run = RunDir(root)
    run.done_flag.unlink(missing_ok=True)  # resuming (fresh = false): the trainer says when it is done
    with stop_on_sigterm(), network(cfg, root, progress) as place:
        plan = _plan(cfg, root, place)
        for name, text in plan.files.items():
            (root / name).write_text(text)
        if plan.mode == "swarm":
            (root / "swarm.json").write_text(json.dumps({"orchestrator": plan.url, "members": plan.members},
                                                        indent=2))
        summary = _supervise(cfg, plan, run, progress, live)
    return finish(cfg, root, *summary)


def wan_roles(cfg: RunConfig) -> list[str]:
    """The roles that get a namespace of their own under a network profile (the adapter shares its trainer's)."""
    relays = cfg.rl.shardcast.relays if cfg.rl.shardcast.enabled else 0
    return ["orchestrator", "trainer", "validator", *(f"relay{i}" for i in range(relays)), *member_names(cfg),
            *(f"guest{i}" for i in range(cfg.wan.guests))]


@contextmanager
def network(cfg: RunConfig, root: Path, progress: Callable[[str], None]) -> Iterator[Placement]:
    """Where the roles run: all on 127.0.0.1 here, or under ``cfg.wan.profile`` each in its namespace behind its
    link (``swarmrl.wan.harness``, set up now and removed on the way out, whatever ends the run), with this
    thread in the orchestrator's namespace meanwhile: the launcher's own calls to it (stake deposits, the
    report) stay on its side of the links, outside the measured traffic."""
    if not cfg.wan.profile:
        sw = cfg.swarm
        servers = ("orchestrator", "trainer", *(f"relay{i}" for i in range(cfg.rl.shardcast.relays)))
        yield Placement() if is_loopback(sw.listen) else Placement.public(sw.listen, sw.advertised(), servers)
        return
    from swarmrl.wan.harness import Harness  # noqa: PLC0415  # lazy: only runs under a network profile
    from swarmrl.wan.netns import inside  # noqa: PLC0415

    (root / "logs").mkdir(parents=True, exist_ok=True)
    h = Harness.for_profile(cfg.wan.profile, wan_roles(cfg), cfg.wan.links, seed=cfg.wan.seed,
                            log=root / "logs" / "wire.log")
    with h:
        (root / "wan.json").write_text(json.dumps({"profile": cfg.wan.profile, "prefix": h.prefix,
                                                   "roles": h.describe()}, indent=2))
        progress(f"network profile {cfg.wan.profile}: {len(h.links)} namespaces ({h.prefix}-*), links: "
                 + ", ".join(f"{r} {link.describe()}" for r, link in h.links.items()))
        with inside(h.netns["orchestrator"]):
            yield Placement(dict(h.hosts), dict(h.netns))


def join_line(plan: Plan) -> str:
    """What another machine runs to join this swarm: the orchestrator's URL and the key that signs its run
    description (made here before the orchestrator starts, so the line is known at once)."""
    from swarmrl.protocol.orchestrator.describe import orchestrator_key_path  # noqa: PLC0415
    assert plan.orchestrator is not None and plan.authority is not None
    key = public_key_hex(load_or_make_private_key(orchestrator_key_path(plan.orchestrator)))
    deposit = (f"swarmrl orchestrator deposit --orchestrator {plan.url} --key {plan.authority.key} --amount "
               f"{plan.orchestrator.min_stake:g} --public-key THEIR_KEY")
    return (f"another machine joins with: swarmrl node join {plan.public_url or plan.url} --run-key {key}  (its "
            f"stake, once it has printed its key: {deposit})")


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """SIGTERM (systemd, ``docker stop``, ``kill``) ends the launcher as Ctrl-C (SIGINT) does, by an exception, so
    its ``finally`` stops every role in order (the roles are in sessions of their own: the signal reaches only the
    launcher). A second SIGTERM while they are being stopped is ignored: the stop is bounded (SIGKILL after
    ``stop_term_s``), and a launcher that dies anyway takes its roles with it (``swarmrl.utils.procs``). Only in
    the main thread (Python delivers signals there); the previous handler comes back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _term(_sig, _frame):  # noqa: ANN001, ANN202
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signal.SIGTERM)

    before = signal.signal(signal.SIGTERM, _term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _supervise(cfg: RunConfig, plan: Plan, run: RunDir, progress: Callable[[str], None],
               live: Callable[[dict], None] | None) -> tuple[float, dict]:
    """Start the roles of ``plan``, watch them until the trainer is done, stop them all (whatever happened);
    returns the run's wall time and report, for ``finish`` (final evaluation, summary)."""
    root, swarm = plan.root, plan.mode == "swarm"
    t0 = time.monotonic()
    report: dict = {}
    dash = None
    # the zygote first: it imports torch, transformers and the roles once while the light roles start; the roles
    # that need them are forked from it (swarmrl.job.zygote)
    (root / "logs").mkdir(parents=True, exist_ok=True)
    zygote = Zygote(preload_modules(cfg.rl.model), root / "logs" / "zygote.log") if cfg.zygote else None
    sup = Supervisor(root / "logs", progress, url=plan.url, pids_file=root / "pids.json", zygote=zygote)
    try:
        # the trainer first: it needs nothing from the other roles (the adapter speaks for it), and its startup
        # (imports, model load, origin) is on the run's critical path, so the orchestrator comes up beside it
        run.forget_servers()  # a resumed run's announcements name the previous processes' ports
        trainer = sup.start(plan.role("trainer"))
        if swarm:
            sup.start(plan.role("orchestrator"))
            deposit_stakes(plan)  # before any node starts: only deposited stake can be locked at registration
            progress(f"orchestrator on {plan.url}; {cfg.swarm.nodes} honest nodes, adversaries: "
                     f"{', '.join(cfg.swarm.adversaries) or 'none'}")
            progress(join_line(plan))
        else:
            dash = DashboardServer(root, port=cfg.dashboard_port).start()
        progress(f"dashboard: {dash.url if dash is not None else plan.url + '/dashboard'}")
        # every other role starts now, while the trainer loads: none needs its origin to come up (workers and nodes
        # find the weight servers in the run dir or in heartbeats once they are announced, version 0 is the base
        # model they hold), so their startup (imports, model load, registration) overlaps the trainer's
        for spec in sorted(plan.roles, key=sup.forks):  # the plain ones first: the forks wait for the zygote
            if spec.name not in sup.procs:
                sup.start(spec)
        if plan.rl.shardcast.enabled:  # the trainer is the SHARDCAST origin; relays under it serve the rest
            origin = wait_for_origin(run, trainer, sup.logs)
            n = plan.rl.shardcast.relays
            upstream = plan.place.local_url("trainer", int(origin["url"].rsplit(":", 1)[1]))  # same machine
            ports = [cfg.swarm.relay_port + i if cfg.swarm.relay_port else free_port() for i in range(n)]
            relays, urls = relay_roles(n, root, upstream, origin["public_key"], ports,
                                       restart="always" if swarm else "never", max_restarts=cfg.swarm.max_restarts,
                                       place=plan.place,
                                       keep=plan.rl.contract.weights.versions_to_serve(plan.rl.shardcast.keep))
            for r in relays:
                sup.start(r)
            run.announce_relays(urls)
            if swarm:
                progress(f"SHARDCAST: origin {origin['url']}, relays {', '.join(urls) or 'none'} "
                         "(announced to nodes in heartbeats)")
        code = sup.watch("trainer", run.is_done, (lambda: live(snapshot(root, t0, swarm))) if live else None)
        if code != 0:
            raise RoleFailed(f"trainer failed with exit code {code}; see {sup.log('trainer')}")
        if swarm:
            report = {"mode": "swarm", "swarm": swarm_report(root, plan.url, plan.members)}
    finally:
        run.done_flag.touch()
        sup.stop_all()
        if zygote is not None:
            zygote.close()
        if dash is not None:
            dash.stop()
    if live is not None:
        live(snapshot(root, t0, swarm))
    progress(f"training done; evaluating the initial and the final model on {cfg.final_eval_n} held-out tasks")
    return time.monotonic() - t0, report
