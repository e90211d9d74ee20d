"""Settings of the shardcast commands (StrictModel: unknown keys are errors). ``FetchConfig`` lives in
``client.config`` (re-exported here), so `swarmrl shardcast fetch` builds only its own model at start-up."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from pydantic import Field, field_validator

from swarmrl.config import StrictModel
from swarmrl.shardcast.client.config import FetchConfig
from swarmrl.shardcast.client.options import RELAY_UPSTREAM, FetchOptions
from swarmrl.shardcast.layout import DEFAULT_SHARD_SIZE
from swarmrl.shardcast.urls import normalize_urls
from swarmrl.utils.serving import ConnLimits

__all__ = ["OriginConfig", "PublishConfig", "RelayConfig", "FetchConfig", "SHARDCAST_LIMITS", "ServerLimits"]

# Connection limits of SHARDCAST servers (swarmrl.utils.serving, swarmrl.shardcast.server.guard). Downstream relays fetch
# with up to 64 parallel connections and aiohttp clients keep idle connections 15 s, so a SHARDCAST server allows
# more per address than the orchestrator and closes idle ones only after a client would have.
SHARDCAST_LIMITS = ConnLimits(max_connections_per_ip=128, idle_timeout_s=30.0)
_L = SHARDCAST_LIMITS


class ServerLimits(StrictModel):
    """Connection limits of a SHARDCAST server (origin or relay)."""

    # per source address (IPv6: per /64) and per process, the latter clipped to the
    # open-files limit; reserved_connections of them only for addresses that got a successful answer within
    # trusted_ttl_s. The first request head must arrive within header_timeout_s; a kept-alive connection with no
    # complete request head for idle_timeout_s is closed (ConnLimits.from_config turns these into limits).
    max_connections: int = Field(_L.max_connections, ge=1)
    max_connections_per_ip: int = Field(_L.max_connections_per_ip, ge=1)
    reserved_connections: int = Field(_L.reserved_connections, ge=0)
    trusted_ttl_s: float = Field(_L.trusted_ttl_s, gt=0)
    header_timeout_s: float = Field(_L.header_timeout_s, gt=0)
    idle_timeout_s: float = Field(_L.idle_timeout_s, gt=0)
    backlog: int = Field(_L.backlog, ge=1)


class OriginConfig(ServerLimits):
    dir: str = Field(description="origin directory (served as-is)")
    host: str = "127.0.0.1"
    port: int = Field(8600, ge=0, le=65535)
    hold_s: float = Field(20.0, gt=0, le=60)
    max_upload_mbps: Optional[float] = Field(None, gt=0, description="upload cap of this server in megabits per "
                                             "second, all shard downloads together (default: none)")


class PublishConfig(StrictModel):
    dir: str
    key: Optional[str] = Field(None, description="origin private key file (default: <dir>.key, created if missing)")
    version: Optional[int] = Field(None, ge=1, description="version number (the training step); default last+1")
    keep: int = Field(5, ge=1)
    shard_size: int = Field(DEFAULT_SHARD_SIZE, ge=1024)
    move: bool = False


class RelayConfig(ServerLimits):
    upstream: list[str] = Field(min_length=1)

    _upstream = field_validator("upstream", mode="before")(lambda cls, v: normalize_urls(v))
    dir: str
    origin_pubkey: str = Field(description="origin public key: 64 hex chars or a file holding them")
    host: str = "127.0.0.1"
    port: int = Field(8601, ge=0, le=65535)
    keep: int = Field(5, ge=1)
    parallel: int = Field(RELAY_UPSTREAM.parallel, ge=1, le=64)  # shards fetched from the upstreams at a time
    poll_s: float = Field(1.0, gt=0, le=30)
    longpoll_s: float = Field(20.0, gt=0, le=60)
    hold_s: float = Field(20.0, gt=0, le=60)
    max_upload_mbps: Optional[float] = Field(None, gt=0, description="upload cap of this server in megabits per "
                                             "second, all shard downloads together (default: none)")
    metrics: Optional[str] = Field(None, description="JSONL file: one row per version mirrored")

    def upstream_options(self) -> FetchOptions:
        """How the relay fetches from its upstreams (``Relay(upstream_options=...)``)."""
        return replace(RELAY_UPSTREAM, parallel=self.parallel)
