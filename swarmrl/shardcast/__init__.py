"""SHARDCAST: broadcast each new checkpoint from the trainer (origin) through a tree of HTTP relays.

Public layout kept (``distribution.txt``, ``v<N>/shard_<IIIII>.bin``, ``data1.bin``, BLAKE3 of the
whole file) plus a per-version manifest signed by the origin's Ed25519 key, so no relay has to be
trusted. See ``layout`` for the wire format.

Integration API::

    from swarmrl.shardcast import Origin, Relay, fetch

    # trainer process
    origin = Origin("runs/x/shardcast", key="runs/x/origin.key", keep=5)
    url = origin.serve(port=8600)            # in-process aiohttp server on a background thread
    origin.publish("runs/x/ckpt/model.safetensors", version=step)   # returns at once (Future)

    # worker process (synchronous)
    res = fetch([relay_a, relay_b], out="policy/model.safetensors",
                origin_pubkey=origin.public_key, version="latest")

The checkpoint is one file (e.g. ``model.safetensors``); the tokenizer/config travel separately.
"""

from swarmrl.shardcast.client import FetchError, FetchResult, fetch, fetch_async
from swarmrl.shardcast.layout import DEFAULT_SHARD_SIZE, LayoutError, Manifest
from swarmrl.shardcast.origin import Origin, PublishResult
from swarmrl.shardcast.relay import Relay
from swarmrl.shardcast.server import BackgroundLoop, ShardServer
from swarmrl.shardcast.signing import SignatureError, keygen, load_public_key

__all__ = ["Origin", "PublishResult", "Relay", "fetch", "fetch_async", "FetchResult", "FetchError",
           "ShardServer", "BackgroundLoop", "Manifest", "LayoutError", "SignatureError", "keygen",
           "load_public_key", "DEFAULT_SHARD_SIZE"]
