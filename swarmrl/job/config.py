"""``RunConfig``: the single source of a run (``swarmrl run``, ``configs/run.toml``). Every role's config is
derived from it by ``swarmrl.job.derive``."""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from swarmrl.attacks.config import ADVERSARY_KINDS, AdversaryConfig
from swarmrl.config import StrictModel
from swarmrl.protocol.config import is_loopback
from swarmrl.rl.config import RLConfig
from swarmrl.sft.config import SFTConfig
from swarmrl.utils.serving import is_wildcard


class WarmstartSection(StrictModel):
    enabled: bool = True
    reuse: bool = True  # skip if the warm-start model already exists
    sft: SFTConfig = Field(default_factory=lambda: SFTConfig(out="runs/warmstart", minutes=2.0, eval_at_minutes=[]))


class SwarmSection(StrictModel):
    """Swarm mode: untrusted nodes behind an orchestrator and a validator."""

    nodes: int = Field(2, ge=0)  # honest nodes
    adversaries: list[str] = Field(default_factory=list)  # one cheating node per entry (see swarmrl.attacks.adversaries)
    # settings handed to every cheating node (fields of attacks.config.AdversaryConfig that only cheats read, e.g. the
    # idle_connections node's idle_round_s, so its rounds fit a short run)
    adversary_set: dict[str, float | int | str] = Field(default_factory=dict)
    tasks_per_node: int = Field(0, ge=0)  # tasks per assignment (0: rl.workers.prompts_per_batch)
    overassign: float = Field(1.0, ge=1.0)  # hand out this many times the groups a step needs
    optimistic: bool = False  # trainer may use submissions before their verdict
    heartbeat_interval_s: float = Field(0.5, gt=0)
    dead_after_missed: int = Field(20, ge=1)
    validator_poll_s: float = Field(0.2, gt=0)
    # the validator waits for uploads and the trainer's adapter for verdicts in long polls this long (0: they poll)
    long_poll_s: float = Field(5.0, ge=0, le=10.0)
    logprob_rows: int = Field(4, ge=0)  # validator's recomputed-logprob sample per submission
    # sampled validation (swarmrl.protocol.spot_checks, docs/protocol.md): the validator's model checks (logprobs,
    # TOPLOC, sampling) run before the verdict on each node's first full_check_first submissions, then on this
    # share of them drawn with the validator's secret; the cheap checks (schema, seed, tasks, policy, proof shape,
    # the multi-turn replay, rewards) always run; audit_rate of the sampled-out, accepted ones are judged in full
    # later and a finding slashes them as a challenge. Under 1, the run is refused unless the stake makes cheating a loss
    # (p (S + G) >= (1 - p) G, S = slashed stake, G = one submission's credit).
    full_check_rate: float = Field(1.0, ge=0, le=1)
    full_check_first: int = Field(2, ge=0)
    audit_rate: float = Field(0.25, ge=0, le=1)
    proofs: bool = True  # nodes attach TOPLOC proofs (swarmrl.toploc) and the validator verifies them
    require_proofs: bool = False  # reject submissions whose TOPLOC check cannot run
    # TOPLOC sampling check: flag a token only below this logprob. Honest T=1 sampling picks some token of
    # probability < e^L with chance < V * e^L per token (V = vocab): -30 keeps that ~1e-11 for a byte vocab,
    # where toploc's default -12 (~1.6e-3 per token) slashed honest nodes within 5 steps in a measured run
    min_token_logprob: float = Field(-30.0, le=0)
    max_upload_bytes: int = Field(8 << 20, gt=0)
    assignment_timeout_s: float = Field(30.0, ge=0)  # open work older than this is reassigned (0: never)
    stake: float = Field(100.0, ge=0)
    node_threads: int = Field(1, ge=1)
    # nodes sample with the newest policy version they hold inside the async window while the assigned one downloads
    # (after a short grace; swarm.config.SwarmNodeConfig.hold_policy); false: they wait for the assigned version
    hold_policy: bool = True
    validator_threads: int = Field(1, ge=1)
    validator_lag: int = Field(3, ge=0)  # policy versions kept beyond the async window for a lagging validator
    max_restarts: int = Field(5, ge=0)  # orchestrator / validator / adapter / relay / honest node restarts
    # the address the orchestrator, the SHARDCAST origin and the relays listen on: "0.0.0.0" (or "::") takes other
    # machines (docs/deploy.md); public_host is then the name or address they reach this machine at, in the URLs the
    # run announces and prints ("" = listen, which a wildcard address cannot be)
    listen: str = Field("127.0.0.1", max_length=255)
    # fixed ports for a deployment's firewall (0: a free one each run): the orchestrator's, and the first relay's
    # (relay i on relay_port + i); the trainer's origin: rl.shardcast.origin_port
    port: int = Field(0, ge=0, le=65535)
    relay_port: int = Field(0, ge=0, le=65535)
    public_host: str = Field("", max_length=255)

    @field_validator("listen", "public_host")
    @classmethod
    def _plain_host(cls, v: str, info: ValidationInfo) -> str:
        """A host name or IP address alone (an IPv6 one without brackets), not a URL or ``host:port``."""
        v = v.strip()
        h = v[1:-1] if v.startswith("[") and v.endswith("]") else v
        if not h and info.field_name == "public_host":
            return ""
        try:
            ip = ipaddress.ip_address(h)
        except ValueError:
            if re.fullmatch(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*\.?", h):
                return h
            raise ValueError(f"swarm.{info.field_name} = {v!r}: give a host name or an IP address alone, without a "
                             "scheme, port or path (e.g. swarm.example.org or 203.0.113.7)") from None
        if info.field_name == "public_host" and ip.is_unspecified:
            raise ValueError(f"swarm.public_host = {v!r} names no machine: give the name or address other machines "
                             "reach this one at")
        return str(ip)

    @model_validator(mode="after")
    def _where(self) -> SwarmSection:
        if is_wildcard(self.listen) and not self.public_host:
            raise ValueError(f"swarm.listen = {self.listen!r} listens on every address but names none: set "
                             "swarm.public_host to the name or address other machines reach this one at")
        return self

    def advertised(self) -> str:
        """The host other machines reach the servers at, as it goes in a URL (an IPv6 address in brackets)."""
        h = self.public_host or self.listen
        return f"[{h}]" if ":" in h else h

    @field_validator("adversaries")
    @classmethod
    def _kinds(cls, v: list[str]) -> list[str]:
        bad = [k for k in v if k not in ADVERSARY_KINDS]
        if bad:
            raise ValueError(f"unknown adversary {bad}; choose from {', '.join(ADVERSARY_KINDS)}")
        return v

    @field_validator("adversary_set")
    @classmethod
    def _cheat_settings(cls, v: dict[str, float | int | str]) -> dict[str, float | int | str]:
        allowed = set(AdversaryConfig.model_fields) - set(AdversaryConfig.__mro__[1].model_fields) - {"adversary"}
        bad = sorted(set(v) - allowed)
        if bad:
            raise ValueError(f"adversary_set: {bad} are not cheat settings; choose from {', '.join(sorted(allowed))}")
        return v


class WanSection(StrictModel):
    """Swarm mode over emulated wide-area links (``swarmrl.wan``): each role in a network namespace of its own
    behind the link its profile gives it (``swarmrl/wan/profiles.toml``). Needs root (CAP_NET_ADMIN)."""

    profile: str = ""  # "": off, every role on 127.0.0.1; else a profile name, e.g. "wan100", "mixed"
    links: dict[str, str] = Field(default_factory=dict)  # role name (n0, relay0, trainer, ...) -> link name
    seed: int = 0  # seeds the links' packet losses
    # namespaces for machines that join later (`swarmrl node join` run with `ip netns exec`), named guest0, ...,
    # on the profile's node links after the run's own nodes; wan.json names each one's namespace and address
    guests: int = Field(0, ge=0, le=16)

    @model_validator(mode="after")
    def _known(self) -> WanSection:
        if self.profile or self.links:
            from swarmrl.wan.profiles import link_plan  # noqa: PLC0415

            link_plan(self.profile or "datacenter", [], self.links)  # unknown profile or link: an error now
        return self


class RunConfig(StrictModel):
    mode: Literal["local", "swarm"] = "local"  # swarm: untrusted nodes behind an orchestrator and validator
    rl: RLConfig = Field(default_factory=RLConfig)
    swarm: SwarmSection = Field(default_factory=SwarmSection)
    warmstart: WarmstartSection = Field(default_factory=WarmstartSection)
    fresh: bool = True  # delete an existing run_dir first (False: resume it)
    max_worker_restarts: int = Field(5, ge=0)  # local mode: restarts of all workers together
    max_trainer_restarts: int = Field(3, ge=0)  # a crashed trainer resumes from its newest checkpoint
    final_eval_n: int = Field(512, ge=1)
    # local mode: the dashboard's port on 127.0.0.1 (0: a free one); in swarm mode the orchestrator serves it
    dashboard_port: int = Field(0, ge=0, le=65535)
    # fork the roles that load torch and the model (workers, nodes, validator) from one process that imported them
    # once (swarmrl.job.zygote) instead of each importing them beside the others; false: plain spawns
    zygote: bool = True
    wan: WanSection = Field(default_factory=WanSection)  # swarm mode: roles over emulated network links

    @model_validator(mode="after")
    def _sampling_pays(self) -> RunConfig:
        """Sampled validation must leave cheating a loss in expectation (``swarmrl.protocol.spot_checks``)."""
        if self.wan.profile and self.mode != "swarm":
            raise ValueError("wan.profile places a swarm run's roles in network namespaces: it needs mode = \"swarm\"")
        if self.wan.profile and not is_loopback(self.swarm.listen):
            raise ValueError("swarm.listen beyond loopback with wan.profile: the network harness places every role on "
                             "its namespace's address itself; use one or the other")
        sw = self.swarm
        if self.mode != "swarm" or sw.full_check_rate >= 1.0:
            return self
        from swarmrl.protocol.config import OrchestratorConfig  # noqa: PLC0415
        from swarmrl.protocol.spot_checks import cheating_margin, min_stake  # noqa: PLC0415

        o = OrchestratorConfig.model_fields
        slash, per_row = o["slash_fraction"].default, o["credit_per_sample"].default
        credit = per_row * (sw.tasks_per_node or self.rl.workers.prompts_per_batch) * self.rl.contract.group_size
        if cheating_margin(sw.full_check_rate, sw.stake, slash, credit) < 1.0:
            raise ValueError(
                f"swarm.full_check_rate = {sw.full_check_rate:g} with swarm.stake = {sw.stake:g} does not make cheating "
                f"a loss: a submission credits G = {credit:g}, a caught node loses S = {slash:g} x stake, and "
                f"p (S + G) >= (1 - p) G needs a stake of at least "
                f"{min_stake(sw.full_check_rate, slash, credit):.0f} (or a higher full_check_rate)")
        return self
