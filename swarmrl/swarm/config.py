"""Settings of a swarm node process (``swarmrl node run``); light enough for ``--print-config`` and config
validation. The cheating nodes' settings are ``swarmrl.attacks.config``."""

from __future__ import annotations

from pydantic import Field

from swarmrl.config import StrictModel
from swarmrl.inference.config import InferenceConfig
from swarmrl.protocol.config import NodeConfig


class SwarmNodeConfig(NodeConfig):
    rl_config: str = ""  # RL config TOML (model, task, sampling, chat template); "" = membership only
    # where policy versions come from (see policy.make_policy_source): "" = the SHARDCAST servers and key the
    # orchestrator's heartbeats announce (the RL config's run_dir until it announces any); "shardcast:PUBKEY" =
    # announced servers, pinned manifest key; "shardcast:PUBKEY@URL,..." = fixed servers; a path = a run dir
    policy_source: str = ""
    work_dir: str = ""  # rollout files before upload ("" = <run_dir>/nodes/<node_id>)
    stop_file: str = ""  # exit once this file exists ("" = <run_dir>/DONE)
    threads: int = Field(1, ge=1)
    policy_timeout_s: float = Field(120.0, gt=0)
    # answering an assignment whose policy version has not arrived within hold_grace_s, sample with the newest
    # version already held that the async window lets serve the assignment's step, while the assigned one
    # downloads in the background (each announced version's download starts at the heartbeat that names it:
    # swarmrl.policy.prefetch); false: wait for the assigned version before sampling
    hold_policy: bool = True
    hold_grace_s: float = Field(0.5, ge=0, le=60)
    deposit_wait_s: float = Field(60.0, ge=0)  # how long registration waits for a stake deposit not made yet
    inference: InferenceConfig | None = None  # the sampling backend (None: the RL config's `inference` section)


class JoinConfig(StrictModel):
    """``swarmrl node join URL``: a node that brings only its own settings; everything of the run (task, sampling,
    scoring, proofs, base model, weight servers) comes from the orchestrator's signed description."""

    orchestrator: str = ""  # the URL of the join line
    # the orchestrator's key of the join line (hex): a description signed by another is refused. "": the key of the
    # first answer, remembered in work_dir/run_key (later joins hold to it)
    run_key: str = ""
    work_dir: str = "swarm-node"  # this node's key, cache (base model, versions), rollout files and metrics
    key: str = ""  # "" = <work_dir>/node.pem, made on first join
    stake: float | None = Field(None, ge=0)  # stake to lock (deposited for this key); None: the run's minimum
    model_dir: str = ""  # a local copy of the base model, used without download when its bundle hash is the run's
    threads: int = Field(1, ge=1)
    inference: InferenceConfig = Field(default_factory=InferenceConfig)  # this machine's sampling backend
    timeout_s: float = Field(30.0, gt=0)  # one request to the orchestrator
    base_wait_s: float = Field(300.0, ge=0)  # how long to wait for a run that has not published its base model yet
    policy_timeout_s: float = Field(600.0, gt=0)  # one policy version's download
    hold_policy: bool = True
    hold_grace_s: float = Field(0.5, ge=0, le=60)
    # how long registration waits for the run's stake authority to deposit for this key (a stranger sends its key
    # and waits for the operator)
    deposit_wait_s: float = Field(600.0, ge=0)
    # refuse to join when the machine has less available memory than this many times the base model's size
    memory_factor: float = Field(3.0, ge=0)
