"""The base model on a node that joined with nothing: SHARDCAST version 0, checked against the run's hash.

``ensure_base`` returns a local model directory holding the run's base model, known by the BLAKE3 of its bundle
(``swarmrl.models.bundle``; the run's description names it): one cached by an earlier join, a local directory whose
bundle has that hash, or else version 0 fetched through the weight servers (signed manifest; refused before any
shard is fetched when the manifest's hash is not the run's), unpacked beside the cache and renamed into place
whole. A download cut off resumes from its verified shards on the next try.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from swarmrl.models.bundle import BundleError, bundle_hash, extract_bundle
from swarmrl.shardcast import FetchError, FetchOptions, fetch
from swarmrl.shardcast.layout import BASE_VERSION

__all__ = ["BaseUnavailable", "ensure_base"]


class BaseUnavailable(RuntimeError):
    """The run's base model could not be obtained here (the reason is the message)."""


def ensure_base(blake3: str, size: int, servers: list[str], pubkey: str, cache_dir: str | Path,
                local: Iterable[str | Path] = (), options: FetchOptions = FetchOptions(),
                wait_s: float = 30.0) -> tuple[Path, dict]:
    """(model directory, report): ``report`` says where it came from (``cached``, ``local`` or ``fetched`` with
    ``seconds`` and ``bytes``). ``wait_s``: how long the servers may take to offer version 0 (a relay may still be
    syncing it)."""
    root = Path(cache_dir) / "base"
    dest = root / blake3[:32]
    if (dest / "config.json").is_file():
        return dest, {"source": "cached"}
    for d in local:
        d = Path(d)
        try:
            if d.is_dir() and bundle_hash(d)[0] == blake3:
                return d, {"source": "local"}
        except (BundleError, OSError):
            continue
    if not servers or not pubkey:
        raise BaseUnavailable("the run names no weight servers yet (the trainer has not announced them)")
    root.mkdir(parents=True, exist_ok=True)
    tar = root / f"{blake3[:32]}.tar"
    t0 = time.perf_counter()
    try:
        res = fetch(servers, tar, pubkey, version=BASE_VERSION, expect_blake3=blake3,
                    options=replace(options, wait_s=wait_s))
    except (FetchError, OSError, ValueError) as e:
        raise BaseUnavailable(f"version 0 (the base model) via {', '.join(servers)}: {e}") from None
    try:
        extract_bundle(tar, dest, max_bytes=size)
    except BundleError as e:
        raise BaseUnavailable(f"version 0 (the base model) is not a usable bundle: {e}") from None
    finally:
        tar.unlink(missing_ok=True)
    return dest, {"source": "fetched", "seconds": round(time.perf_counter() - t0, 3), "bytes": res.size}
