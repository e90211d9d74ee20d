"""Where a node gets the weights of a policy version.

``PolicySource`` is the small interface nodes (and the validator) use: ``latest()`` names the newest
published version, ``fetch(version)`` returns a local HF model directory holding it (waiting up to
``timeout_s`` for it to appear). ``RunDirPolicySource`` reads the trainer's run directory (one
machine, shared disk); a SHARDCAST-backed source (download through relays into a local cache dir)
implements the same two methods.
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


SHARDCAST_OFFSET = 1  # SHARDCAST versions start at 1: policy version v is published as v + 1


class ShardcastPolicySource:
    """Policy versions fetched through SHARDCAST relays (``swarmrl.shardcast.fetch``: signed manifest, BLAKE3
    per shard) into ``cache_dir/v{n:06d}/model.safetensors``; config and tokenizer files come from
    ``base_model_dir`` (they never change during a run). Keeps the newest ``keep`` versions on disk."""

    def __init__(self, servers: list[str], origin_pubkey: str, cache_dir: str | Path, base_model_dir: str | Path,
                 keep: int = 4) -> None:
        self.servers, self.origin_pubkey = list(servers), origin_pubkey
        self.cache = Path(cache_dir)
        self.cache.mkdir(parents=True, exist_ok=True)
        self.base = Path(base_model_dir)
        self.keep = keep
        self._latest: int | None = None

    def latest(self) -> int | None:
        return self._latest

    def fetch(self, version: int, timeout_s: float = 60.0) -> Path:
        import shutil

        from swarmrl.shardcast import FetchError, fetch

        d = self.cache / f"v{version:06d}"
        if (d / "model.safetensors").is_file():
            return d
        d.mkdir(parents=True, exist_ok=True)
        for f in self.base.iterdir():
            if f.is_file() and not f.name.endswith((".safetensors", ".pt", ".bin")):
                shutil.copy2(f, d / f.name)
        try:
            fetch(self.servers, d / "model.safetensors", self.origin_pubkey, version=version + SHARDCAST_OFFSET,
                  wait_s=timeout_s)
        except (FetchError, OSError) as e:
            raise PolicyUnavailable(f"policy v{version} via SHARDCAST: {e}") from None
        self._latest = max(version, self._latest or 0)
        for old in sorted(self.cache.glob("v*"))[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return d


def make_policy_source(spec: str, cache_dir: str | Path = "", base_model_dir: str | Path = "") -> PolicySource:
    """``spec``: a run directory (``rundir:PATH`` or a bare path), or ``shardcast:PUBKEY@URL[,URL...]`` (the origin's
    public key, hex, and relay/origin URLs; needs ``cache_dir`` and ``base_model_dir``)."""
    kind, sep, rest = spec.partition(":")
    if sep and kind == "shardcast":
        pub, at, urls = rest.partition("@")
        if not at or not urls:
            raise ValueError("shardcast policy source: use shardcast:PUBKEY@URL[,URL...]")
        return ShardcastPolicySource(urls.split(","), pub, cache_dir, base_model_dir)
    if sep and kind == "rundir":
        return RunDirPolicySource(rest)
    return RunDirPolicySource(spec)


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
