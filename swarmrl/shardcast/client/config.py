"""Settings of `swarmrl shardcast fetch` (StrictModel: unknown keys are errors), on their own so that the command
builds only this model at start-up (``swarmrl.shardcast.config`` re-exports it with the other commands' settings).
The fetch settings are ``FetchOptions``'s fields with its defaults; ``FetchConfig.options()`` builds it."""

from __future__ import annotations

from dataclasses import fields
from typing import Literal, Optional, Union

from pydantic import Field, field_validator, model_validator

from swarmrl.config import StrictModel
from swarmrl.shardcast.client.options import FetchOptions
from swarmrl.shardcast.urls import normalize_urls

__all__ = ["FetchConfig"]

_F = FetchOptions()  # the defaults, declared there


class FetchConfig(StrictModel):
    server: list[str] = Field(min_length=1)
    out: str
    origin_pubkey: Optional[str] = Field(None, description="origin public key (required unless insecure)")
    insecure: bool = Field(_F.insecure, description="also accept a plain SHARDCAST 0.3.x server (no signed "
                           "manifest): only its whole-file checksum, from the same untrusted server, is checked")
    version: Union[int, Literal["latest"]] = "latest"
    parallel: Optional[int] = Field(_F.parallel, ge=1, le=64, description="shard downloads in flight (default: 2 "
                                    "per server, at most 8)")
    max_attempts: int = Field(_F.max_attempts, ge=1, le=100)
    max_server_failures: int = Field(_F.max_server_failures, ge=1, le=100)
    wait_s: float = Field(_F.wait_s, ge=0)
    verify_whole: bool = _F.verify_whole
    fsync: bool = _F.fsync
    metrics: Optional[str] = Field(None, description="JSONL file: one row per fetch")
    # progress deadline per shard request: no byte for stall_s, or under min_bps over window_s, drops the server
    stall_s: float = Field(_F.stall_s, gt=0)
    min_bps: float = Field(_F.min_bps, ge=0)
    window_s: float = Field(_F.window_s, gt=0)

    _server = field_validator("server", mode="before")(lambda cls, v: normalize_urls(v))

    @model_validator(mode="after")
    def _key_unless_insecure(self) -> FetchConfig:
        if self.origin_pubkey is None and not self.insecure:
            raise ValueError("origin_pubkey is required (or insecure = true for an unsigned 0.3.x server)")
        return self

    def options(self) -> FetchOptions:
        """The fetch's ``FetchOptions``: the fields above that are its own, its defaults for the rest."""
        own = [f.name for f in fields(FetchOptions) if f.name in type(self).model_fields]
        return FetchOptions(**{k: getattr(self, k) for k in own})

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, v: object) -> object:
        if isinstance(v, str) and v.isdigit():
            return int(v)
        return v
