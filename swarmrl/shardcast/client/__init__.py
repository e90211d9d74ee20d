"""SHARDCAST's client side: fetching one signed version from several servers.

- ``fetch``: the entry points (``fetch`` / ``fetch_async``, ``FetchResult``, ``FetchError``);
- ``pool``: the servers (health and throughput per server, the versions each offers, the signed manifest);
- ``download``: shards, each from the best server, resumed, checked against its BLAKE3 and written to a sink;
- ``http_get``: the small HTTP/1.1 GET client shard bodies are read with (straight into reusable buffers);
- ``wholehash``: the whole file's BLAKE3, computed in file order while shards arrive;
- ``unsigned``: reading a plain SHARDCAST 0.3.x server (no signed manifest; ``insecure`` only);
- ``options``: ``FetchOptions``, how a fetch goes (attempts, parallelism, progress deadline, ...), one frozen
  object passed whole through every layer above;
- ``config``: the settings of `swarmrl shardcast fetch` (they build a ``FetchOptions``).

Relays (``swarmrl.shardcast.server.relay``) fetch their upstreams through this package; nothing here imports
the server side."""
