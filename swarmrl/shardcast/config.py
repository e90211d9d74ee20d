"""Settings of the shardcast commands (StrictModel: unknown keys are errors)."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import Field, field_validator

from swarmrl.config import StrictModel
from swarmrl.shardcast.layout import DEFAULT_SHARD_SIZE

__all__ = ["OriginConfig", "PublishConfig", "RelayConfig", "FetchConfig"]


class OriginConfig(StrictModel):
    dir: str = Field(description="origin directory (served as-is)")
    host: str = "127.0.0.1"
    port: int = Field(8600, ge=0, le=65535)
    hold_s: float = Field(20.0, gt=0, le=60)


class PublishConfig(StrictModel):
    dir: str
    key: Optional[str] = Field(None, description="origin private key file (default: <dir>.key, created if missing)")
    version: Optional[int] = Field(None, ge=1, description="version number (the training step); default last+1")
    keep: int = Field(5, ge=1)
    shard_size: int = Field(DEFAULT_SHARD_SIZE, ge=1024)
    move: bool = False


class RelayConfig(StrictModel):
    upstream: list[str] = Field(min_length=1)
    dir: str
    origin_pubkey: str = Field(description="origin public key: 64 hex chars or a file holding them")
    host: str = "127.0.0.1"
    port: int = Field(8601, ge=0, le=65535)
    keep: int = Field(5, ge=1)
    parallel: int = Field(4, ge=1, le=64)
    poll_s: float = Field(1.0, gt=0, le=30)
    longpoll_s: float = Field(20.0, gt=0, le=60)
    hold_s: float = Field(20.0, gt=0, le=60)
    metrics: Optional[str] = Field(None, description="JSONL file: one row per version mirrored")


class FetchConfig(StrictModel):
    server: list[str] = Field(min_length=1)
    out: str
    origin_pubkey: str
    version: Union[int, Literal["latest"]] = "latest"
    parallel: int = Field(8, ge=1, le=64)
    max_attempts: int = Field(6, ge=1, le=100)
    max_server_failures: int = Field(3, ge=1, le=100)
    wait_s: float = Field(0.0, ge=0)
    verify_whole: bool = True
    fsync: bool = False
    metrics: Optional[str] = Field(None, description="JSONL file: one row per fetch")

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, v: object) -> object:
        if isinstance(v, str) and v.isdigit():
            return int(v)
        return v
