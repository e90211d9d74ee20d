"""``FetchOptions``: the one declaration of how a SHARDCAST client fetches, passed whole through the layers; the
CLI's ``FetchConfig`` and a relay's ``RelayConfig`` build it without defaults of their own."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from swarmrl.shardcast import FetchOptions, Relay, fetch, fetch_async
from swarmrl.shardcast.client.download import download_shards
from swarmrl.shardcast.client.options import RELAY_UPSTREAM
from swarmrl.shardcast.client.unsigned import fetch_unsigned
from swarmrl.shardcast.config import FetchConfig, RelayConfig


def test_the_cli_settings_are_the_options_fields_with_their_defaults():
    cfg = FetchConfig(server=["127.0.0.1:1"], out="x", insecure=True)
    assert cfg.options() == FetchOptions(insecure=True)
    shared = [f.name for f in dataclasses.fields(FetchOptions) if f.name in FetchConfig.model_fields]
    assert len(shared) >= 10
    for name in shared:  # not redeclared: the config's default is the options'
        assert FetchConfig.model_fields[name].default == getattr(FetchOptions(), name), name
    set_ = FetchConfig(server=["127.0.0.1:1"], out="x", origin_pubkey="k", parallel=3, stall_s=2.0, fsync=True)
    assert set_.options() == FetchOptions(parallel=3, stall_s=2.0, fsync=True)


def test_a_relay_fetches_its_upstreams_with_the_relay_options():
    assert RelayConfig(upstream=["127.0.0.1:1"], dir="d", origin_pubkey="k").upstream_options() == RELAY_UPSTREAM
    assert RelayConfig(upstream=["127.0.0.1:1"], dir="d", origin_pubkey="k", parallel=2).upstream_options() == \
        dataclasses.replace(RELAY_UPSTREAM, parallel=2)
    assert inspect.signature(Relay).parameters["upstream_options"].default is RELAY_UPSTREAM


def test_options_are_frozen_checked_and_size_the_streams():
    o = FetchOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.parallel = 3  # type: ignore[misc]
    for bad in ({"max_attempts": 0}, {"parallel": 0}, {"stall_s": 0.0}, {"min_bps": -1.0}, {"wait_s": -1.0}):
        with pytest.raises(ValueError, match="out of range"):
            FetchOptions(**bad)
    assert [o.streams(n) for n in (0, 1, 3, 4, 9)] == [2, 2, 6, 8, 8]
    assert FetchOptions(parallel=3).streams(9) == 3


def test_the_entry_points_take_the_options_whole():
    for fn in (fetch, fetch_async, download_shards, fetch_unsigned):
        params = inspect.signature(fn).parameters
        assert params["options"].default == FetchOptions(), fn.__name__
        loose = {f.name for f in dataclasses.fields(FetchOptions)} & set(params)
        assert not loose, f"{fn.__name__} takes {loose} loose"
    # what one call fetches: servers, out, key, version, min_version, on_shard, and the hash known from elsewhere
    assert len(inspect.signature(fetch_async).parameters) == 8
