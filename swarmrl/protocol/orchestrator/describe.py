"""``RunDescriber``: the signed run description (``swarmrl.protocol.description``) this orchestrator serves at
``GET /v1/run``, built from its config (the contract, heartbeat pacing, minimum stake), the packages installed
here that generate the contract's task, and what the trainer announced (weight servers, their key, the base
model). Signed with the orchestrator's key: ``OrchestratorConfig.key``, or ``<data_dir>/orchestrator.pem`` made on
first start (several server processes: the first writes it, the others read it)."""

from __future__ import annotations

import time
from pathlib import Path

from swarmrl.envs.requirements import requirements
from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.description import PackagePin, RunDescription, SignedDescription, WeightsRef, sign_description
from swarmrl.protocol.orchestrator.run_state import RunState
from swarmrl.utils.keys import load_or_make_private_key, public_key_hex

KEY_NAME = "orchestrator.pem"


def orchestrator_key_path(cfg: OrchestratorConfig) -> Path:
    return Path(cfg.key) if cfg.key else Path(cfg.data_dir) / KEY_NAME


class RunDescriber:
    def __init__(self, cfg: OrchestratorConfig, run: RunState) -> None:
        self._cfg = cfg
        self._run = run
        self._key = load_or_make_private_key(orchestrator_key_path(cfg))
        self.public_key = public_key_hex(self._key)
        self._requires = [PackagePin(name=r.name, version=r.version) for r in requirements(cfg.contract.task.name)]

    def describe(self) -> SignedDescription:
        servers, pubkey, base = self._run.announced()
        cfg = self._cfg
        d = RunDescription(orchestrator_key=self.public_key, contract=cfg.contract, requires=self._requires,
                           base=base, weights=WeightsRef(servers=servers, public_key=pubkey),
                           heartbeat_interval_s=cfg.heartbeat_interval_s,
                           heartbeats_per_interval=cfg.heartbeats_per_interval,
                           min_stake=0.0 if cfg.self_declared_stake else cfg.min_stake, issued_at=int(time.time()))
        return sign_description(d, self._key)
