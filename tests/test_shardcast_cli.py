"""The `swarmrl shardcast` command group (thin layer): keygen, publish, config, fetch errors."""

from __future__ import annotations

import pytest
from _shardcast_util import make_file, same_file
from typer.testing import CliRunner

from swarmrl.shardcast import Origin, fetch

pytest.importorskip("typer")


@pytest.fixture(scope="module")
def app():
    from swarmrl.cli import app as root

    return root


def test_keygen_publish_and_fetch_via_cli(tmp_path, app):
    run = CliRunner()
    key = tmp_path / "origin.key"
    r = run.invoke(app, ["shardcast", "keygen", "--out", str(key)])
    assert r.exit_code == 0, r.output
    pub = (tmp_path / "origin.key.pub").read_text().strip()
    assert pub in r.output
    assert run.invoke(app, ["shardcast", "keygen", "--out", str(key)]).exit_code == 2  # never overwrite a key

    src = make_file(tmp_path / "model.safetensors", 300_000, seed=3)
    odir = tmp_path / "origin"
    r = run.invoke(app, ["shardcast", "publish", "--dir", str(odir), "--key", str(key), str(src), "--version", "12",
                         "--set", "shard_size=65536"])
    assert r.exit_code == 0, r.output
    assert (odir / "distribution.txt").read_text().startswith("v12: ")
    r = run.invoke(app, ["shardcast", "publish", "--dir", str(odir), "--key", str(key), str(src), "--version", "12"])
    assert r.exit_code == 2 and "never reused" in " ".join(r.output.split())  # a usage error: the version given

    o = Origin(odir, key=key)  # the published dir served by the API
    url = o.serve()
    try:
        out = tmp_path / "got.bin"
        r = run.invoke(app, ["shardcast", "fetch", "--server", url, "--origin-pubkey", str(tmp_path / "origin.key.pub"),
                             "--out", str(out), "--version", "12"])
        assert r.exit_code == 0, r.output
        assert same_file(out, src)
        small_order = "00" * 32  # refused before any request: a usage error
        r = run.invoke(app, ["shardcast", "fetch", "--server", url, "--origin-pubkey", small_order, "--out",
                             str(tmp_path / "bad.bin")])
        assert r.exit_code == 2 and "small order" in r.output
        assert fetch([url], tmp_path / "api.bin", pub).version == 12
    finally:
        o.close()


def test_cli_configs_resolve_and_reject_typos(app):
    run = CliRunner()
    r = run.invoke(app, ["shardcast", "relay", "--upstream", "http://a:1", "--upstream", "http://b:2", "--dir", "d",
                         "--origin-pubkey", "k.pub", "--print-config"])
    assert r.exit_code == 0, r.output
    assert 'upstream = ["http://a:1", "http://b:2"]' in r.output
    r = run.invoke(app, ["shardcast", "fetch", "--server", "http://a:1", "--out", "x", "--origin-pubkey", "k",
                         "--version", "7", "--print-config"])
    assert r.exit_code == 0 and "version = 7" in r.output
    r = run.invoke(app, ["shardcast", "fetch", "--server", "http://a:1", "--out", "x", "--origin-pubkey", "k",
                         "--set", "paralel=3"])
    assert r.exit_code == 2 and "unknown field" in " ".join(r.output.split())
