"""Settings of `swarmrl shardcast fetch` (StrictModel: unknown keys are errors), on their own so that the command
builds only this model at start-up (``swarmrl.shardcast.config`` re-exports it with the other commands' settings)."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import Field, field_validator, model_validator

from swarmrl.config import StrictModel
from swarmrl.shardcast.urls import normalize_urls

__all__ = ["FetchConfig"]


class FetchConfig(StrictModel):
    server: list[str] = Field(min_length=1)
    out: str
    origin_pubkey: Optional[str] = Field(None, description="origin public key (required unless insecure)")
    insecure: bool = Field(False, description="also accept a plain SHARDCAST 0.3.x server (no signed manifest): "
                           "only its whole-file checksum, from the same untrusted server, is checked")
    version: Union[int, Literal["latest"]] = "latest"
    parallel: Optional[int] = Field(None, ge=1, le=64, description="shard downloads in flight (default: 2 per "
                                    "server, at most 8)")
    max_attempts: int = Field(6, ge=1, le=100)
    max_server_failures: int = Field(3, ge=1, le=100)
    wait_s: float = Field(0.0, ge=0)
    verify_whole: bool = True
    fsync: bool = False
    metrics: Optional[str] = Field(None, description="JSONL file: one row per fetch")
    # progress deadline per shard request: no byte for stall_s, or under min_bps over window_s, drops the server
    stall_s: float = Field(10.0, gt=0)
    min_bps: float = Field(32 * 1024, ge=0)
    window_s: float = Field(10.0, gt=0)

    _server = field_validator("server", mode="before")(lambda cls, v: normalize_urls(v))

    @model_validator(mode="after")
    def _key_unless_insecure(self) -> FetchConfig:
        if self.origin_pubkey is None and not self.insecure:
            raise ValueError("origin_pubkey is required (or insecure = true for an unsigned 0.3.x server)")
        return self

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, v: object) -> object:
        if isinstance(v, str) and v.isdigit():
            return int(v)
        return v
