"""SHARDCAST: broadcast each new checkpoint from the trainer (origin) through a tree of HTTP relays.

Public layout kept (``distribution.txt``, ``v<N>/shard_<IIIII>.bin``, ``data1.bin``, BLAKE3 of the
whole file) plus a per-version manifest signed by the origin's Ed25519 key, so no relay has to be
trusted. See ``layout`` for the wire format.

Integration API::

    from swarmrl.shardcast import FetchOptions, Origin, Relay, fetch

    # trainer process
    origin = Origin("runs/x/shardcast", key="runs/x/origin.key", keep=5)
    url = origin.serve(port=8600)            # in-process aiohttp server on a background thread
    origin.publish("runs/x/ckpt/model.safetensors", version=step)   # returns at once (Future)

    # worker process (synchronous); how it fetches is one frozen FetchOptions (attempts, parallelism, deadlines)
    res = fetch([relay_a, relay_b], out="policy/model.safetensors",
                origin_pubkey=origin.public_key, version="latest", options=FetchOptions(wait_s=30))

The checkpoint is one file (e.g. ``model.safetensors``); the tokenizer/config travel separately.
"""

from __future__ import annotations

from swarmrl.utils.lazy import lazy_exports

# Attributes load on first use: importing the package (e.g. for ``swarmrl.shardcast.config``) must not
# pull in aiohttp.
_EXPORTS = {
    "Origin": "swarmrl.shardcast.server.origin", "PublishResult": "swarmrl.shardcast.server.origin",
    "Relay": "swarmrl.shardcast.server.relay",
    "fetch": "swarmrl.shardcast.client.fetch", "fetch_async": "swarmrl.shardcast.client.fetch",
    "FetchResult": "swarmrl.shardcast.client.fetch", "FetchError": "swarmrl.shardcast.client.fetch",
    "FetchOptions": "swarmrl.shardcast.client.options",
    "ShardServer": "swarmrl.shardcast.server.shard_server", "BackgroundLoop": "swarmrl.shardcast.server.shard_server",
    "Manifest": "swarmrl.shardcast.layout", "LayoutError": "swarmrl.shardcast.layout",
    "DEFAULT_SHARD_SIZE": "swarmrl.shardcast.layout",
    "SignatureError": "swarmrl.shardcast.signing", "keygen": "swarmrl.shardcast.signing",
    "load_public_key": "swarmrl.shardcast.signing",
}
__all__ = ["Origin", "PublishResult", "Relay", "fetch", "fetch_async", "FetchOptions", "FetchResult", "FetchError",
           "ShardServer", "BackgroundLoop", "Manifest", "LayoutError", "SignatureError", "keygen",
           "load_public_key", "DEFAULT_SHARD_SIZE"]

__getattr__ = lazy_exports(_EXPORTS)
