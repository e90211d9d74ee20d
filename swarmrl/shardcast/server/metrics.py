"""Prometheus metrics of a SHARDCAST server (origin or relay), served at ``GET /metrics`` by ``server``.

One ``CollectorRegistry`` per ``ShardServer`` (never the process-wide default: tests run many servers in one
process); a ``Relay`` adds its own metrics to its server's registry. Responses are counted by an aiohttp
``on_response_prepare`` hook (status, and the Content-Length of GET bodies: a file sent by sendfile is counted
whole when its response starts); the upstream byte and transfer counts are read from the relay's ``ServerPool``
at scrape time, so downloading costs nothing extra. The text is rendered at most once per ``cache_s``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["ServerMetrics", "RelayMetrics"]

# (complete versions, partial versions, newest complete version or 0)
VersionsReader = Callable[[], tuple[int, int, int]]


class _VersionsCollector(Collector):
    def __init__(self, read: VersionsReader) -> None:
        self.read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        complete, partial, latest = self.read()
        g = GaugeMetricFamily("swarmrl_shardcast_versions", "Versions held, by state", labels=["state"])
        g.add_metric(["complete"], complete)
        g.add_metric(["partial"], partial)
        yield g
        yield GaugeMetricFamily("swarmrl_shardcast_latest_version", "Newest complete version served (0: none)",
                                value=latest)


class ServerMetrics:
    """A SHARDCAST server's metrics: requests by status, body bytes served, versions held."""

    def __init__(self, versions: VersionsReader | None = None, cache_s: float = 1.0) -> None:
        r = self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter("swarmrl_shardcast_requests", "HTTP responses by status", ["status"], registry=r)
        self.bytes_served = Counter("swarmrl_shardcast_bytes_served",
                                    "Body bytes of GET responses (shards, manifests, lists)", registry=r)
        self._children: dict[int, Any] = {}
        if versions is not None:
            r.register(_VersionsCollector(versions))
        self.cache_s = cache_s
        self._lock = threading.Lock()
        self._text, self._at = b"", -float("inf")

    def response(self, method: str, status: int, content_length: int | None) -> None:
        """Count one response (``status``; its body bytes for a GET answered 200 or 206)."""
        c = self._children.get(status)
        if c is None:
            c = self._children[status] = self.requests.labels(str(status))
        c.inc()
        if content_length and method == "GET" and status in (200, 206):
            self.bytes_served.inc(content_length)

    def exposition(self) -> bytes:
        """The Prometheus text format, rendered at most once per ``cache_s`` (bounds what scrapes cost)."""
        with self._lock:
            now = time.monotonic()
            if now - self._at >= self.cache_s:
                self._text, self._at = generate_latest(self.registry), now
            return self._text


class _UpstreamCollector(Collector):
    def __init__(self, servers: Callable[[], Iterable[Any]]) -> None:
        self.servers = servers

    def collect(self) -> Iterator[CounterMetricFamily]:
        nbytes = CounterMetricFamily("swarmrl_shardcast_relay_upstream_bytes", "Shard bytes fetched from each "
                                     "upstream", labels=["upstream"])
        shards = CounterMetricFamily("swarmrl_shardcast_relay_upstream_transfers", "Shard transfers completed "
                                     "from each upstream (a Range-resumed shard counts once per transfer)",
                                     labels=["upstream"])
        for s in self.servers():
            nbytes.add_metric([s.url], s.bytes)
            shards.add_metric([s.url], s.shards)
        yield nbytes
        yield shards


class RelayMetrics:
    """A relay's metrics, in its server's registry: shards verified, versions synced, bytes per upstream
    (``servers`` returns the pool's ``ServerState`` objects: ``url``, ``bytes``, ``shards``)."""

    def __init__(self, registry: CollectorRegistry, servers: Callable[[], Iterable[Any]]) -> None:
        self.shards_verified = Counter("swarmrl_shardcast_relay_shards_verified",
                                       "Shards fetched, BLAKE3-verified and put in place", registry=registry)
        self.versions_synced = Counter("swarmrl_shardcast_relay_versions_synced",
                                       "Versions mirrored completely", registry=registry)
        registry.register(_UpstreamCollector(servers))
