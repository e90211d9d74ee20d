"""Running the orchestrator's app: one process (``ClosingServer``: held long polls answer when it stops) or, on
PostgreSQL, several uvicorn workers on one socket, each building its app from the config in the environment."""

from __future__ import annotations

import os

from fastapi import FastAPI

from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.orchestrator import guard
from swarmrl.protocol.orchestrator.http import create_app
from swarmrl.protocol.orchestrator.service import Orchestrator
from swarmrl.utils.serving import ConnLimits

_CFG_ENV = "SWARMRL_ORCHESTRATOR_CONFIG"


def app_from_env() -> FastAPI:
    """App factory for multi-process serving: the config travels as JSON in an environment variable."""
    return create_app(OrchestratorConfig.model_validate_json(os.environ[_CFG_ENV]))


def serve(cfg: OrchestratorConfig) -> None:
    """Serve on cfg.host:cfg.port behind the connection limits of ``guard`` (cfg's connection-limit fields).
    ``workers > 1`` runs that many processes on one socket (PostgreSQL only: SQLite serialises writers through a
    lock inside one process)."""
    limits = ConnLimits.from_config(cfg)
    if cfg.workers > 1:
        if not cfg.database_url or cfg.database_url.startswith("sqlite"):
            raise ValueError("workers > 1 needs a PostgreSQL database_url (SQLite allows one writer process)")
        Orchestrator(cfg).close()  # create tables and principals once, before the workers start
        os.environ[_CFG_ENV] = cfg.model_dump_json()
        guard.run("swarmrl.protocol.orchestrator:app_from_env", limits, factory=True, host=cfg.host, port=cfg.port,
                  workers=cfg.workers)
    else:
        orch = Orchestrator(cfg)
        guard.run(create_app(cfg, orch), limits, host=cfg.host, port=cfg.port, on_close=orch.changes.close)
