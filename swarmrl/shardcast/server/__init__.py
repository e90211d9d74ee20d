"""SHARDCAST's serving side: the origin that publishes versions and the relays that mirror them.

- ``shard_server``: the aiohttp app every SHARDCAST node serves its directory with (``ShardServer``) and the
  background event loop it runs on;
- ``origin``: turns checkpoint files into signed, sharded versions (``Origin``);
- ``relay``: mirrors signed versions from upstreams, verifying each shard, and serves them onward (``Relay``);
- ``streaming``: the shared upload cap and shards served while they still arrive;
- ``guard``: connection caps and read deadlines under aiohttp;
- ``metrics``: Prometheus metrics of a server.

A relay is a client of its upstreams (``swarmrl.shardcast.client``); the client never imports this package."""
