"""``derive``: one ``RunConfig`` turned into every role's config and command line. Pure: ports, keys and the
run secret come in as arguments, nothing is started or written, so a plan is tested without processes.

Rules that tie the roles together live here once, each from the contract's point of view:

- the RL config all local workers, nodes, the trainer and the adapter read (``rl.toml``), with what swarm
  mode needs on top (TOPLOC proofs on honest nodes; enough policy versions kept for the validator's lag,
  ``AsyncWindow.versions_to_keep``);
- the orchestrator's and the validator's configs, which carry the run config's ``rl.contract`` as it is (task,
  group size, staleness window, tie rule, budget, sampling settings, proof geometry: nothing re-derived), with the
  orchestrator's demand settings and the validator's checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from swarmrl.config import dump_config
from swarmrl.job.config import RunConfig
from swarmrl.protocol.config import OrchestratorConfig, ValidatorConfig
from swarmrl.rl.config import RLConfig
from swarmrl.rollouts.limits import RolloutLimits
from swarmrl.rundir import RunLayout
from swarmrl.utils.serving import is_wildcard

Restart = Literal["never", "always", "unless_refused"]


@dataclass(frozen=True)
class Identity:
    """An Ed25519 key file and what it names."""

    key: str
    public_key: str
    node_id: str


@dataclass(frozen=True)
class Placement:
    """Where each role listens and which network namespace it runs in (``swarmrl.wan.harness``): by role name,
    the adapter in its trainer's; a role not named is on 127.0.0.1 in the launcher's namespace."""

    hosts: dict[str, str] = field(default_factory=dict)
    netns: dict[str, str] = field(default_factory=dict)
    # where a role listens when that is not the address others reach it at (``swarm.listen`` = 0.0.0.0: ``hosts``
    # name the public host, this the wildcard address)
    binds: dict[str, str] = field(default_factory=dict)

    @classmethod
    def public(cls, listen: str, public_host: str, roles: tuple[str, ...]) -> Placement:
        """The servers (``roles``) listen on ``listen`` and are announced at ``public_host``; the rest stay on
        127.0.0.1 and reach them there."""
        return cls(hosts={r: public_host for r in roles}, binds={r: listen for r in roles})

    def host(self, role: str) -> str:
        return self.hosts.get("trainer" if role == "adapter" else role, "127.0.0.1")

    def listen(self, role: str) -> str:
        """The address ``role`` listens on."""
        return self.binds.get("trainer" if role == "adapter" else role) or self.host(role)

    def ns(self, role: str) -> str:
        return self.netns.get("trainer" if role == "adapter" else role, "")

    def url(self, role: str, port: int) -> str:
        return f"http://{self.host(role)}:{port}"

    def local_url(self, role: str, port: int) -> str:
        """``role`` as the run's own roles on this machine reach it: 127.0.0.1 when it listens on every address
        (no detour through a public name a NAT may not loop back), else as others do."""
        return f"http://127.0.0.1:{port}" if is_wildcard(self.binds.get(role, "")) else self.url(role, port)


@dataclass(frozen=True)
class RoleSpec:
    """One role process: ``python -m swarmrl <argv>``, and what the supervisor does when it exits.

    ``restart``: ``always`` (while the run is not done), ``never``, or ``unless_refused`` (a node: not after
    exit code 3, ejected or refused, nor after a signal from outside). Restarts count against
    ``max_restarts`` per ``restart_group`` (roles of one group share the count). A ``finishes`` role (the
    trainer) that exits with 0 has finished its work and is not restarted."""

    name: str
    argv: list[str]
    restart: Restart = "always"
    max_restarts: int = 5
    restart_group: str = ""  # "" = the role's own name
    wait_up: bool = False  # after (re)start, wait until the orchestrator answers
    stop_wait_s: float = 0.0  # at the end: time to exit on its own before SIGTERM
    stop_term_s: float = 1.0  # then SIGKILL after this long
    stop_last: bool = False  # stopped after every other role (the orchestrator)
    finishes: bool = False  # exit code 0 means done (the trainer), not a crash
    netns: str = ""  # the network namespace it runs in (a network profile's harness, swarmrl.wan); "": this one


@dataclass
class Plan:
    mode: Literal["local", "swarm"]
    root: Path
    rl: RLConfig
    roles: list[RoleSpec]  # in start order; relays come later (they need the trainer's origin)
    files: dict[str, str] = field(default_factory=dict)  # name under root -> text
    url: str = ""  # the orchestrator (swarm mode), as the run's own roles reach it
    public_url: str = ""  # the orchestrator as other machines reach it (the join line); "" = url
    members: dict[str, dict] = field(default_factory=dict)  # swarm nodes: identity and adversary kind
    orchestrator: OrchestratorConfig | None = None
    validator: ValidatorConfig | None = None
    authority: Identity | None = None  # the stake authority key (swarm mode)
    deposits: dict[str, float] = field(default_factory=dict)  # node id -> stake the authority deposits
    place: Placement = field(default_factory=lambda: Placement())  # addresses and namespaces (network profile)

    def role(self, name: str) -> RoleSpec:
        return next(r for r in self.roles if r.name == name)


def derive_rl(cfg: RunConfig, origin_port: int = 0, origin_host: str = "127.0.0.1") -> RLConfig:
    """The RL config every RL role reads. With SHARDCAST the trainer's origin gets a fixed port
    (``origin_port``) so a restarted trainer serves where its relays look. Swarm mode keeps the versions a
    lagging validator still checks and has honest nodes attach TOPLOC proofs when the validator verifies them."""
    rl = cfg.rl
    if rl.shardcast.enabled and origin_port and not rl.shardcast.origin_port:
        rl = rl.model_copy(update={"shardcast": rl.shardcast.model_copy(update={"origin_port": origin_port})})
    if rl.shardcast.enabled and origin_host != rl.shardcast.origin_host:
        rl = rl.model_copy(update={"shardcast": rl.shardcast.model_copy(update={"origin_host": origin_host})})
    if cfg.mode != "swarm":
        return rl
    keep = rl.contract.window().versions_to_keep(lag=cfg.swarm.validator_lag)
    if rl.keep_versions < keep:
        rl = rl.model_copy(update={"keep_versions": keep})
    if cfg.swarm.proofs and not rl.workers.proofs:
        rl = rl.model_copy(update={"workers": rl.workers.model_copy(update={"proofs": True})})
    return rl


def member_names(cfg: RunConfig) -> dict[str, str]:
    """Swarm nodes by name -> adversary kind ("" for honest nodes)."""
    return {**{f"n{i}": "" for i in range(cfg.swarm.nodes)},
            **{f"x{i}-{kind}": kind for i, kind in enumerate(cfg.swarm.adversaries)}}


def _trainer(cfg: RunConfig, rl_path: str, term_s: float, netns: str = "") -> RoleSpec:
    """The trainer: restarted after a crash (it resumes from its newest committed version), done on exit 0."""
    return RoleSpec("trainer", ["rl", "trainer", "--config", rl_path], restart="always", finishes=True,
                    max_restarts=cfg.max_trainer_restarts, stop_term_s=term_s, netns=netns)


def derive_local(cfg: RunConfig, root: Path, origin_port: int = 0) -> Plan:
    rl = derive_rl(cfg, origin_port)
    rl_path = str(root / "rl.toml")
    roles = [_trainer(cfg, rl_path, 5.0)]
    roles += [RoleSpec(f"w{i}", ["rl", "worker", "--config", rl_path, "--id", f"w{i}"], restart_group="workers",
                       max_restarts=cfg.max_worker_restarts, stop_wait_s=10.0, stop_term_s=5.0)
              for i in range(rl.workers.num)]
    return Plan("local", root, rl, roles, files={"rl.toml": dump_config(rl)})


def derive_swarm(cfg: RunConfig, root: Path, port: int, secret: str, validator: Identity, trainer: Identity,
                 members: dict[str, Identity], authority: Identity, origin_port: int = 0,
                 place: Placement | None = None) -> Plan:
    """The orchestrator, validator, trainer, adapter and node roles of a swarm run, the orchestrator on
    127.0.0.1:``port`` (under a network profile: on its namespace's address, ``place``, each role in its own). The
    ``authority`` key deposits every member's stake (``Plan.deposits``) once the orchestrator is up, before any
    node starts: only deposited stake can be locked at registration."""
    place = place or Placement()
    sw, rl = cfg.swarm, derive_rl(cfg, origin_port, place.listen("trainer"))
    if rl.shardcast.enabled and place.listen("trainer") != place.host("trainer"):  # announced at the public host
        rl = rl.model_copy(update={"shardcast": rl.shardcast.model_copy(
            update={"origin_public_host": place.host("trainer")})})
    url, public_url = place.local_url("orchestrator", port), place.url("orchestrator", port)
    kinds = member_names(cfg)
    ocfg = OrchestratorConfig(
        host=place.listen("orchestrator"), port=port, data_dir=str(root / "orchestrator"), run_secret=secret,
        validator_keys=[validator.public_key], trainer_keys=[trainer.public_key],
        stake_authority_keys=[authority.public_key], register_burst=max(20, 2 * len(members)),
        idle_after_missed=max(2, sw.dead_after_missed // 2),
        heartbeat_interval_s=sw.heartbeat_interval_s, dead_after_missed=sw.dead_after_missed, sweep_interval_s=0.5,
        rate_limit_per_s=200.0, rate_limit_burst=400, min_stake=min(100.0, sw.stake),
        contract=rl.contract, tasks_per_node=sw.tasks_per_node or rl.workers.prompts_per_batch,
        lookahead=rl.contract.async_level, last_step=rl.steps - 1, groups_per_step=rl.prompts_per_step,
        overassign=sw.overassign, rollout_limits=RolloutLimits(max_bytes=sw.max_upload_bytes),
        optimistic=sw.optimistic, assignment_timeout_s=sw.assignment_timeout_s, metrics_interval_s=1.0)
    vcfg = ValidatorConfig(orchestrator=url, key=validator.key, model_dir=rl.model, contract=rl.contract,
                           model_dir_template=RunLayout(root).version_template(), run_secret=secret,
                           poll_interval_s=sw.validator_poll_s, long_poll_s=sw.long_poll_s, work_dir=str(root / "validator"),
                           logprob_rows=sw.logprob_rows, require_proofs=sw.require_proofs,
                           sampling_thresholds={"min_token_logprob": sw.min_token_logprob},
                           reject_late_steps=False, threads=sw.validator_threads,
                           full_check_rate=sw.full_check_rate, full_check_first=sw.full_check_first,
                           audit_rate=sw.audit_rate)
    rl_path, opath, vpath = (str(root / n) for n in ("rl.toml", "orchestrator.toml", "validator.toml"))

    def node(name: str) -> RoleSpec:
        m, kind = members[name], kinds[name]
        argv = ["node", "run", "--orchestrator", url, "--key", m.key, "--rl-config", rl_path,
                "--set", f"stake={sw.stake}", "--set", f"threads={sw.node_threads}",
                "--set", f"hold_policy={str(sw.hold_policy).lower()}"]
        if kind:
            argv += ["--adversary", kind, "--set", f"oversize_bytes={sw.max_upload_bytes + 1}"]
            argv += [a for k, v in sorted(sw.adversary_set.items()) for a in ("--set", f"{k}={v}")]
        return RoleSpec(name, argv, restart="never" if kind else "unless_refused", max_restarts=sw.max_restarts,
                        stop_term_s=3.0, netns=place.ns(name))

    always = {"restart": "always", "max_restarts": sw.max_restarts}
    roles = [
        RoleSpec("orchestrator", ["orchestrator", "serve", "--config", opath], wait_up=True, stop_last=True,
                 stop_term_s=5.0, netns=place.ns("orchestrator"), **always),
        _trainer(cfg, rl_path, 1.0, place.ns("trainer")),
        RoleSpec("adapter", ["rl", "adapter", "--config", rl_path, "--orchestrator", url, "--key", trainer.key,
                            "--long-poll-s", str(sw.long_poll_s)],
                 netns=place.ns("adapter"), **always),
        RoleSpec("validator", ["validator", "run", "--config", vpath], netns=place.ns("validator"), **always),
        *(node(name) for name in kinds),
    ]
    info = {name: {"key": m.key, "public_key": m.public_key, "node_id": m.node_id, "adversary": kinds[name]}
            for name, m in members.items()}
    deposits = {m.node_id: sw.stake for m in members.values()} if sw.stake > 0 else {}
    return Plan("swarm", root, rl, roles, url=url, public_url=public_url, members=info, orchestrator=ocfg,
                validator=vcfg,
                authority=authority, deposits=deposits, place=place,
                files={"rl.toml": dump_config(rl), "orchestrator.toml": dump_config(ocfg),
                       "validator.toml": dump_config(vcfg)})


def relay_roles(n: int, root: Path, origin_url: str, origin_pubkey: str, ports: list[int],
                restart: Restart = "always", max_restarts: int = 5,
                place: Placement | None = None, keep: int = 5) -> tuple[list[RoleSpec], list[str]]:
    """``n`` SHARDCAST relays under the trainer's origin (each on its port; under a network profile on its
    namespace's address, ``place``), each keeping ``keep`` versions besides the base model, and their URLs."""
    place = place or Placement()
    roles, urls = [], []
    for i in range(n):
        name = f"relay{i}"
        roles.append(RoleSpec(name, ["shardcast", "relay", "--upstream", origin_url,
                                     "--dir", str(root / "shardcast" / name), "--port", str(ports[i]),
                                     "--origin-pubkey", origin_pubkey, "--set", f"keep={keep}",
                                     *(["--set", f"host={place.listen(name)}"]
                                       if place.ns(name) or place.listen(name) != "127.0.0.1" else [])],
                              restart=restart, max_restarts=max_restarts, netns=place.ns(name)))
        urls.append(place.url(name, ports[i]))
    return roles, urls
