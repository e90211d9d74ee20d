"""How a SHARDCAST client fetches: one frozen options object, declared here with one default per field and passed
whole through every layer that fetches (``fetch`` / ``fetch_async``, ``download_shards``, ``fetch_unsigned``, a
relay's upstream fetches, the policy sources). Callers change a field with ``dataclasses.replace``. Standard
library only: `swarmrl shardcast fetch` builds it at start-up (``FetchConfig.options``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FetchOptions", "RELAY_UPSTREAM"]


@dataclass(frozen=True)
class FetchOptions:
    """The settings of a fetch; what one call fetches (servers, file, key, version, callbacks) is passed beside it.

    Progress deadline of each shard request (``swarmrl.shardcast.client.download``): the response headers within
    ``read_timeout``, then no gap of ``stall_s`` without a byte and at least ``min_bps`` over ``window_s``; a server
    that misses it is dropped for that shard (and out of the fetch when another server has the version)."""

    parallel: int | None = None  # shard downloads in flight; None: two per server, at most 8 (``streams``)
    max_attempts: int = 6  # tries per shard
    max_server_failures: int = 3  # failures in a row that exclude a server
    read_timeout: float = 30.0  # seconds to a shard's response headers
    stall_s: float = 10.0  # no byte of a shard's body for this long drops the server for that shard
    min_bps: float = 32 * 1024  # nor fewer bytes per second than this ...
    window_s: float = 10.0  # ... over this window
    not_ready_s: float = 600.0  # a shard no server has ready (503) for this long ends the fetch
    wait_s: float = 0.0  # how long to keep polling the servers for the version to appear
    verify_whole: bool = True  # the whole file re-hashed against the signed checksum before the rename
    fsync: bool = False  # the file flushed to disk before the rename
    insecure: bool = False  # also accept a plain SHARDCAST 0.3.x server (no signed manifest; module ``unsigned``)

    def __post_init__(self) -> None:
        counts = {"max_attempts": self.max_attempts, "max_server_failures": self.max_server_failures}
        if self.parallel is not None:
            counts["parallel"] = self.parallel
        bad = [f"{k}={v}" for k, v in counts.items() if v < 1]
        bad += [f"{k}={v}" for k, v in (("read_timeout", self.read_timeout), ("stall_s", self.stall_s),
                                        ("window_s", self.window_s), ("not_ready_s", self.not_ready_s)) if not v > 0]
        bad += [f"{k}={v}" for k, v in (("min_bps", self.min_bps), ("wait_s", self.wait_s)) if not v >= 0]
        if bad:
            raise ValueError(f"FetchOptions: {', '.join(bad)} out of range (counts >= 1, times > 0, rates >= 0)")

    def streams(self, servers: int) -> int:
        """Shard downloads in flight with ``servers`` servers: ``parallel``, else two per server (they keep the
        in-order whole-file hash just behind the download), at most 8."""
        return self.parallel if self.parallel is not None else min(8, 2 * max(servers, 1))


# a relay's fetches from its upstreams: four shards in flight, four tries per shard in a round (the relay retries
# the round itself until its upstreams withdraw the version)
RELAY_UPSTREAM = FetchOptions(parallel=4, max_attempts=4)
