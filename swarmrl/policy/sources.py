"""Where a role gets the weights of policy version N.

``PolicySource`` is the small interface: ``latest()`` names the newest version it knows, ``fetch(version)``
returns a local HF model directory holding it (waiting up to ``timeout_s`` for it to appear) or raises
``PolicyUnavailable``, ``local(version)`` names its directory when it is already on this machine (no download,
no wait; None otherwise), and ``take_fetch_report()`` hands out the figures of the newest download (once; None when
nothing was downloaded since), for the holder's metrics.

- ``RunDirPolicySource``: the trainer's policy dir (one machine, shared disk);
- ``TemplatePolicySource``: a path template such as ``runs/x/policy/v{policy_version:06d}`` (the validator);
- ``ShardcastPolicySource``: downloads through SHARDCAST servers into a cache dir (signed manifest, BLAKE3
  per shard; a version published as a delta is applied to the version before it, bit-exact or refused); its
  servers are fixed, or ``discover``-ed before each fetch (a local worker reads the run dir's ``origin.json`` /
  ``relays.json``);
- ``AnnouncedPolicySource`` (a node's default): switches to SHARDCAST as soon as the orchestrator's
  heartbeat names weight servers.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from swarmrl.models.adapter_file import (
    ADAPTER_FILE,
    MODEL_FILE,
    AdapterRefused,
    AdapterSpec,
    header_metadata,
    is_adapter_file,
    weights_file,
    write_sidecars,
)
from swarmrl.rundir import RunLayout
from swarmrl.rundir.policy_versions import PolicyDir
from swarmrl.shardcast import FetchError, FetchOptions
from swarmrl.shardcast.client.chain import fetch_chain


class PolicyUnavailable(RuntimeError):
    """The requested policy version cannot be obtained (pruned, not published in time, corrupt)."""


class PolicySource(Protocol):
    def latest(self) -> int | None: ...

    def fetch(self, version: int, timeout_s: float = 60.0) -> Path: ...

    def local(self, version: int) -> Path | None: ...

    def take_fetch_report(self) -> dict | None: ...


class _NoDownloads:
    """Sources that read local directories: nothing is downloaded, so there is nothing to report."""

    def take_fetch_report(self) -> dict | None:
        return None


class RunDirPolicySource(_NoDownloads):
    """Policy versions straight from ``run_dir/policy/v{n:06d}`` (written atomically by the trainer)."""

    def __init__(self, run_dir: str | Path, poll_s: float = 0.05) -> None:
        self.policies = PolicyDir(RunLayout(run_dir).policy)
        self.poll_s = poll_s

    def latest(self) -> int | None:
        return self.policies.latest_version()

    def local(self, version: int) -> Path | None:
        d = self.policies.version_dir(version)
        return d if weights_file(d) is not None else None

    def fetch(self, version: int, timeout_s: float = 60.0) -> Path:
        d = self.policies.version_dir(version)
        deadline = time.monotonic() + timeout_s
        while weights_file(d) is None:  # the full model's or a LoRA adapter's file
            latest = self.latest()
            if latest is not None and latest > version and not d.exists():
                raise PolicyUnavailable(f"policy v{version} is gone (newest is v{latest})")
            if time.monotonic() > deadline:
                raise PolicyUnavailable(f"policy v{version} did not appear within {timeout_s:.0f}s")
            time.sleep(self.poll_s)
        return d


class TemplatePolicySource(_NoDownloads):
    """Version N at ``template.format(policy_version=N)``; a template without the field names one model for
    every version. Nothing is waited for: a missing directory is unavailable at once."""

    def __init__(self, template: str) -> None:
        self.template = template

    def latest(self) -> int | None:
        return None

    def local(self, version: int) -> Path | None:
        d = Path(self.template.format(policy_version=version))
        return d if (d / "config.json").is_file() else None

    def fetch(self, version: int, timeout_s: float = 0.0) -> Path:
        d = self.local(version)
        if d is None:
            raise PolicyUnavailable(f"no model for policy version {version} at "
                                    f"{self.template.format(policy_version=version)}")
        return d


Discover = Callable[[], "tuple[list[str], str] | None"]


class ShardcastPolicySource:
    """Policy versions fetched through SHARDCAST servers into ``cache_dir/v{n:06d}/model.safetensors``, as the
    trainer's origin publishes them: policy version N is SHARDCAST version N, and version 0 is the initial
    model every holder starts from (``base_model_dir``, whose config and tokenizer files are copied next to
    each fetched version: held already, or fetched as SHARDCAST version 0 before the node starts,
    ``swarmrl.policy.base``). Servers and the manifest key may change during a run (``set_servers``, or a
    ``discover`` callable asked before each fetch). Keeps the newest ``keep`` versions on disk. ``options``: how
    each version is fetched (``FetchOptions``; its ``wait_s`` is each ``fetch``'s ``timeout_s``)."""

    def __init__(self, servers: list[str], origin_pubkey: str, cache_dir: str | Path, base_model_dir: str | Path,
                 keep: int = 4, discover: Discover | None = None, options: FetchOptions = FetchOptions()) -> None:
        self.servers, self.origin_pubkey = list(servers), origin_pubkey
        self.options = options
        self.cache = Path(cache_dir)
        self.cache.mkdir(parents=True, exist_ok=True)
        self.base = Path(base_model_dir)
        self.keep = keep
        self.discover = discover
        self._latest: int | None = None
        self._report: dict | None = None  # the newest download's figures, until taken

    def set_servers(self, servers: list[str], origin_pubkey: str) -> None:
        self.servers, self.origin_pubkey = list(servers), origin_pubkey

    def take_fetch_report(self) -> dict | None:
        report, self._report = self._report, None
        return report

    def latest(self) -> int | None:
        return self._latest

    def local(self, version: int) -> Path | None:
        if version == 0:
            return self.base
        d = self._vdir(version)
        return d if weights_file(d) is not None else None

    def _vdir(self, version: int) -> Path:
        return self.cache / f"v{version:06d}"

    def _held_file(self, version: int) -> Path | None:
        """Version ``version``'s weights file when it is in the cache (a delta's base); never the base model's."""
        f = self._vdir(version) / MODEL_FILE
        return f if version > 0 and f.is_file() else None

    def _dir_for(self, version: int) -> Path:
        """Version ``version``'s cache directory, with the base model's config and tokenizer files in it."""
        d = self._vdir(version)
        d.mkdir(parents=True, exist_ok=True)
        for f in self.base.iterdir():
            if f.is_file() and not f.name.endswith((".safetensors", ".pt", ".bin")):
                shutil.copy2(f, d / f.name)
        return d

    def fetch(self, version: int, timeout_s: float = 60.0) -> Path:
        """Version ``version``: whole, or as deltas from a version held here (``swarmrl.shardcast.client.chain``:
        each version on the way is kept in the cache too)."""
        have = self.local(version)
        if have is not None:
            return have
        if self.discover is not None:
            found = self.discover()
            if found is not None:
                self.set_servers(*found)
        if not self.servers or not self.origin_pubkey:
            raise PolicyUnavailable(f"policy v{version}: no SHARDCAST servers known yet")
        try:
            res = fetch_chain(self.servers, self.origin_pubkey, version, held=self._held_file,
                              out_for=lambda v: self._dir_for(v) / MODEL_FILE,
                              options=replace(self.options, wait_s=timeout_s))
        except (FetchError, OSError) as e:
            raise PolicyUnavailable(f"policy v{version} via SHARDCAST: {e}") from None
        d = res.path.parent
        _name_adapter(d)
        self._report = {"version": version, "fetch_s": round(res.seconds, 4), "bytes": res.bytes,
                        "bytes_by_server": res.bytes_by_server, "excluded": res.excluded,
                        "path": [f"{s.kind}:v{s.version}" for s in res.steps]}
        self._latest = max(version, self._latest or 0)
        # the newest `keep` complete versions stay (a failed download's partial directory neither counts nor goes:
        # the next try of that version resumes it)
        for old in [p for p in sorted(self.cache.glob("v*")) if weights_file(p) is not None][: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return d


def _name_adapter(d: Path) -> None:
    """A fetched file that is a LoRA adapter (its metadata says so) is renamed as one, with peft's config and the
    base marker beside it (holders tell adapters by the metadata, whatever the name: a crash here is harmless)."""
    f = d / "model.safetensors"
    if not is_adapter_file(f):
        return
    try:
        spec = AdapterSpec.from_meta(header_metadata(f))
    except AdapterRefused:
        return  # left as it is: the holder refuses it with the reason
    write_sidecars(d, spec)
    f.replace(d / ADAPTER_FILE)


class AnnouncedPolicySource:
    """What a node uses by default: SHARDCAST through the servers the orchestrator's heartbeat names (and the
    manifest key it names, unless one is pinned in the node's config), or ``fallback`` (the run directory on a
    one-machine setup) while no server has been announced."""

    def __init__(self, fallback: PolicySource, cache_dir: str | Path, base_model_dir: str | Path,
                 pinned_pubkey: str = "", options: FetchOptions = FetchOptions()) -> None:
        self.fallback = fallback
        self.pinned = pinned_pubkey
        self.shardcast = ShardcastPolicySource([], pinned_pubkey, cache_dir, base_model_dir, options=options)
        self.using_shardcast = False

    def update(self, servers: list[str], pubkey: str) -> None:
        if servers:
            self.shardcast.set_servers(servers, self.pinned or pubkey)
            self.using_shardcast = True

    def latest(self) -> int | None:
        return (self.shardcast if self.using_shardcast else self.fallback).latest()

    def fetch(self, version: int, timeout_s: float = 60.0) -> Path:
        return (self.shardcast if self.using_shardcast else self.fallback).fetch(version, timeout_s)

    def local(self, version: int) -> Path | None:
        return (self.shardcast if self.using_shardcast else self.fallback).local(version)

    def take_fetch_report(self) -> dict | None:
        return (self.shardcast if self.using_shardcast else self.fallback).take_fetch_report()


class _Unannounced(_NoDownloads):
    def latest(self) -> int | None:
        return None

    def fetch(self, version: int, timeout_s: float = 60.0) -> Path:
        raise PolicyUnavailable(f"policy v{version}: the orchestrator has not announced weight servers yet")

    def local(self, version: int) -> Path | None:
        return None


def make_policy_source(spec: str, cache_dir: str | Path = "", base_model_dir: str | Path = "",
                       fallback_run_dir: str | Path = "", options: FetchOptions = FetchOptions()) -> PolicySource:
    """``spec``: a run directory (``rundir:PATH`` or a bare path); ``shardcast:PUBKEY@URL[,URL...]`` (the origin's
    public key, hex, and relay/origin URLs); ``shardcast:PUBKEY`` or ``""``: the servers heartbeats announce
    (``AnnouncedPolicySource``: pinned key, or the announced one with ``""``), falling back to
    ``fallback_run_dir`` until they do. SHARDCAST sources need ``cache_dir`` and ``base_model_dir``, and fetch with
    ``options``."""
    kind, sep, rest = spec.partition(":")
    if not spec or (sep and kind == "shardcast" and "@" not in rest):
        fallback = RunDirPolicySource(fallback_run_dir) if fallback_run_dir else _Unannounced()
        return AnnouncedPolicySource(fallback, cache_dir, base_model_dir, pinned_pubkey=rest if spec else "",
                                     options=options)
    if sep and kind == "shardcast":
        pub, _, urls = rest.partition("@")
        if not urls:
            raise ValueError("shardcast policy source: use shardcast:PUBKEY@URL[,URL...]")
        return ShardcastPolicySource(urls.split(","), pub, cache_dir, base_model_dir, options=options)
    if sep and kind == "rundir":
        return RunDirPolicySource(rest)
    return RunDirPolicySource(spec)
