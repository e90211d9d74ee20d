"""Settings of a swarm node process (``swarmrl node run``); light enough for ``--print-config`` and config
validation. The cheating nodes' settings are ``swarmrl.attacks.config``."""

from __future__ import annotations

from pydantic import Field

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
    inference: InferenceConfig | None = None  # the sampling backend (None: the RL config's `inference` section)
