"""Where a node gets the weights of a policy version.

``PolicySource`` is the small interface nodes (and the validator) use: ``latest()`` names the newest
published version, ``fetch(version)`` returns a local HF model directory holding it (waiting up to
``timeout_s`` for it to appear). ``RunDirPolicySource`` reads the trainer's run directory (one
machine, shared disk); ``ShardcastPolicySource`` downloads through SHARDCAST relays into a local cache
dir (signed manifest, verified shards); ``AnnouncedPolicySource`` (a node's default) switches to
SHARDCAST as soon as the orchestrator's heartbeat names weight servers.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

import torch
from safetensors.torch import load_file

from swarmrl.models.io import load_model


class PolicyUnavailable(RuntimeError):
    """The requested policy version cannot be obtained (pruned, not published in time, corrupt)."""


class PolicySource(Protocol):
    def latest(self) -> int | None: ...

    def fetch(self, version: int, timeout_s: float = 60.0) -> Path: ...


class RunDirPolicySource:
    """Policy versions straight from ``run_dir/policy/v{n:06d}`` (written atomically by the trainer)."""

    def __init__(self, run_dir: str | Path, poll_s: float = 0.1) -> None:
        from swarmrl.rl.store import RunDir

        self.run = RunDir(run_dir)
        self.poll_s = poll_s

    def latest(self) -> int | None:
        return self.run.latest_version()

    def fetch(self, version: int, timeout_s: float = 60.0) -> Path:
        d = self.run.version_dir(version)
        deadline = time.monotonic() + timeout_s
        while not (d / "model.safetensors").is_file():
            latest = self.run.latest_version()
            if latest is not None and latest > version and not d.exists():
                raise PolicyUnavailable(f"policy v{version} is gone (newest is v{latest})")
            if time.monotonic() > deadline:
                raise PolicyUnavailable(f"policy v{version} did not appear within {timeout_s:.0f}s")
            time.sleep(self.poll_s)
        return d


class ShardcastPolicySource:
    """Policy versions fetched through SHARDCAST servers (``swarmrl.shardcast.fetch``: signed manifest, BLAKE3
    per shard) into ``cache_dir/v{n:06d}/model.safetensors``, as the trainer's origin publishes them: policy
    version N is SHARDCAST version N, and version 0 is the initial model every node starts from
    (``base_model_dir``, whose config and tokenizer files are copied next to each fetched version).
    ``servers`` and the manifest key may change during a run (``set_servers``).
    Keeps the newest ``keep`` versions on disk."""

    def __init__(self, servers: list[str], origin_pubkey: str, cache_dir: str | Path, base_model_dir: str | Path,
                 keep: int = 4) -> None:
        self.servers, self.origin_pubkey = list(servers), origin_pubkey
        self.cache = Path(cache_dir)
        self.cache.mkdir(parents=True, exist_ok=True)
        self.base = Path(base_model_dir)
        self.keep = keep
        self._latest: int | None = None

    def set_servers(self, servers: list[str], origin_pubkey: str) -> None:
        self.servers, self.origin_pubkey = list(servers), origin_pubkey

    def latest(self) -> int | None:
        return self._latest

    def fetch(self, version: int, timeout_s: float = 60.0) -> Path:
        import shutil

        from swarmrl.shardcast import FetchError, fetch

        if version == 0:
            return self.base
        d = self.cache / f"v{version:06d}"
        if (d / "model.safetensors").is_file():
            return d
        if not self.servers or not self.origin_pubkey:
            raise PolicyUnavailable(f"policy v{version}: no SHARDCAST servers known yet")
        d.mkdir(parents=True, exist_ok=True)
        for f in self.base.iterdir():
            if f.is_file() and not f.name.endswith((".safetensors", ".pt", ".bin")):
                shutil.copy2(f, d / f.name)
        try:
            fetch(self.servers, d / "model.safetensors", self.origin_pubkey, version=version, wait_s=timeout_s)
        except (FetchError, OSError) as e:
            raise PolicyUnavailable(f"policy v{version} via SHARDCAST: {e}") from None
        self._latest = max(version, self._latest or 0)
        for old in sorted(self.cache.glob("v*"))[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return d


class AnnouncedPolicySource:
    """What a node uses by default: SHARDCAST through the servers the orchestrator's heartbeat names (and the
    manifest key it names, unless one is pinned in the node's config), or ``fallback`` (the run directory on a
    one-machine setup) while no server has been announced."""

    def __init__(self, fallback: PolicySource, cache_dir: str | Path, base_model_dir: str | Path,
                 pinned_pubkey: str = "") -> None:
        self.fallback = fallback
        self.pinned = pinned_pubkey
        self.shardcast = ShardcastPolicySource([], pinned_pubkey, cache_dir, base_model_dir)
        self.using_shardcast = False

    def update(self, servers: list[str], pubkey: str) -> None:
        if servers:
            self.shardcast.set_servers(servers, self.pinned or pubkey)
            self.using_shardcast = True

    def latest(self) -> int | None:
        return (self.shardcast if self.using_shardcast else self.fallback).latest()

    def fetch(self, version: int, timeout_s: float = 60.0) -> Path:
        return (self.shardcast if self.using_shardcast else self.fallback).fetch(version, timeout_s)


def make_policy_source(spec: str, cache_dir: str | Path = "", base_model_dir: str | Path = "",
                       fallback_run_dir: str | Path = "") -> PolicySource:
    """``spec``: a run directory (``rundir:PATH`` or a bare path); ``shardcast:PUBKEY@URL[,URL...]`` (the origin's
    public key, hex, and relay/origin URLs); ``shardcast:PUBKEY`` or ``""``: the servers heartbeats announce
    (``AnnouncedPolicySource``: pinned key, or the announced one with ``""``), falling back to
    ``fallback_run_dir`` until they do. SHARDCAST sources need ``cache_dir`` and ``base_model_dir``."""
    kind, sep, rest = spec.partition(":")
    if not spec or (sep and kind == "shardcast" and "@" not in rest):
        fallback = RunDirPolicySource(fallback_run_dir) if fallback_run_dir else _Unannounced()
        return AnnouncedPolicySource(fallback, cache_dir, base_model_dir, pinned_pubkey=rest if spec else "")
    if sep and kind == "shardcast":
        pub, _, urls = rest.partition("@")
        if not urls:
            raise ValueError("shardcast policy source: use shardcast:PUBKEY@URL[,URL...]")
        return ShardcastPolicySource(urls.split(","), pub, cache_dir, base_model_dir)
    if sep and kind == "rundir":
        return RunDirPolicySource(rest)
    return RunDirPolicySource(spec)


class _Unannounced:
    def latest(self) -> int | None:
        return None

    def fetch(self, version: int, timeout_s: float = 60.0) -> Path:
        raise PolicyUnavailable(f"policy v{version}: the orchestrator has not announced weight servers yet")


class PolicyModel:
    """One model in memory whose weights are swapped to the version an assignment names."""

    def __init__(self, source: PolicySource, init_model_path: str | Path) -> None:
        self.source = source
        self.model = load_model(init_model_path)
        self.model.eval()
        self.version = -1

    def load(self, version: int, timeout_s: float = 60.0) -> torch.nn.Module:
        if version == self.version:
            return self.model
        path = self.source.fetch(version, timeout_s) / "model.safetensors"
        try:
            state = load_file(str(path))
        except (OSError, ValueError) as e:
            raise PolicyUnavailable(f"policy v{version}: {e}") from None
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or [m for m in missing if "lm_head" not in m]:
            raise PolicyUnavailable(f"policy v{version} does not match the model: missing {missing}, "
                                    f"unexpected {unexpected}")
        if getattr(self.model.config, "tie_word_embeddings", False):
            self.model.tie_weights()
        self.model.eval()
        self.version = version
        return self.model
