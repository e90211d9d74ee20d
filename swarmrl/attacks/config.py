"""Settings of a cheating node (``swarmrl node run --adversary KIND``) and the names of the kinds
(``swarmrl.attacks.adversaries`` implements each); light enough for ``--print-config`` and config validation."""

from __future__ import annotations

from pydantic import Field, field_validator

from swarmrl.swarm.config import SwarmNodeConfig

ADVERSARY_KINDS: tuple[str, ...] = ("random_model", "edit_tokens", "forge_rewards", "replay", "stale_policy",
                                    "own_tasks", "malformed", "oversized", "wrong_key", "bomb", "flood",
                                    "idle_connections", "late_edit_tokens", "edit_env_turn", "forge_tool_result",
                                    "other_temperature")


class AdversaryConfig(SwarmNodeConfig):
    """A cheating node (demos and tests): an honest node's settings plus what its cheat needs."""

    adversary: str
    honest_first: int = Field(3, ge=0)  # late_edit_tokens: honest submissions before it starts cheating
    own_temperature: float = Field(1.7, ge=0, le=100)  # other_temperature: what it samples at instead of the run's
    replay_from: str = ""  # replay: dir whose */*.parquet it steals ("" = <run_dir>/nodes)
    oversize_bytes: int = Field(5 << 20, gt=0)  # oversized: size of the file it uploads
    bomb_bytes: int = Field(2 << 30, gt=0)  # bomb: what its (few-kilobyte) file decodes to (32x max_decoded_bytes)
    flood_batch: int = Field(50, ge=1)  # flood: fresh keys it tries to register per burst
    flood_interval_s: float = Field(5.0, gt=0)  # flood: pause between bursts (and after a 429, its Retry-After)
    # idle_connections: half-sent connections held to the orchestrator and to each weight relay heartbeats name,
    # from idle_addresses source addresses (on loopback 127.0.0.2 and up; the default 1024 / 256 = 4 per address and
    # server, far under a server's per-address cap, so that cap alone cannot shed them). Bounded: this many per
    # server, in rounds of idle_round_s after idle_delay_s and with idle_rest_s between rounds (the honest nodes'
    # latency with and without the attack is what judges it: job.report), replacing closed ones at most
    # idle_reconnect_per_s
    idle_conns: int = Field(1024, ge=1, le=4096)
    idle_addresses: int = Field(256, ge=1, le=4096)
    idle_round_s: float = Field(20.0, gt=0, le=600)
    idle_rest_s: float = Field(10.0, ge=0, le=600)
    idle_delay_s: float = Field(10.0, ge=0, le=600)
    idle_reconnect_per_s: float = Field(200.0, ge=0, le=1000)

    @field_validator("adversary")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v not in ADVERSARY_KINDS:
            raise ValueError(f"unknown adversary {v!r}; choose from {', '.join(ADVERSARY_KINDS)}")
        return v
