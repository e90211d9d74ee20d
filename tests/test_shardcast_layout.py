"""Layout parsing and manifest signing: strict rejection of untrusted input."""

from __future__ import annotations

import json

import pytest

from swarmrl.shardcast.layout import (
    DistEntry,
    LayoutError,
    Manifest,
    ShardInfo,
    format_distribution,
    parse_distribution,
    shard_relpath,
)
from swarmrl.shardcast.signing import (
    SignatureError,
    generate_key,
    keygen,
    load_private_key,
    load_public_key,
    public_key_hex,
    sign_manifest,
    verify_manifest,
)

H = "ab" * 32


def _manifest(version: int = 3) -> Manifest:
    return Manifest(version=version, size=25, shard_size=10, blake3=H,
                    shards=(ShardInfo(10, "01" * 32), ShardInfo(10, "02" * 32), ShardInfo(5, "03" * 32)),
                    filename="model.safetensors", created=1)


def test_public_paths_and_distribution_roundtrip():
    assert shard_relpath(12, 1) == "v12/shard_00001.bin"
    assert shard_relpath(1, 99999) == "v1/shard_99999.bin"
    with pytest.raises(LayoutError):
        shard_relpath(1, 0)
    entries = [DistEntry(2, H, 3), DistEntry(10, "cd" * 32, 1)]
    text = format_distribution(entries)
    assert text == f"v2: {H}|3\nv10: {'cd' * 32}|1\n"
    assert parse_distribution(text) == entries
    assert parse_distribution("") == []
    # version 0 is the run's base model (swarmrl.models.bundle), listed before the policy versions
    assert [e.version for e in parse_distribution(f"v0: {H}|3\nv2: {H}|1\n")] == [0, 2]


@pytest.mark.parametrize("bad", [
    f"v1: {H}",                      # no shard count
    f"v1: {H.upper()}|3",            # uppercase hex
    f"v-1: {H}|3",                   # a negative version
    f"v1: {H}|0",                    # zero shards
    f"v2: {H}|1\nv1: {H}|1",         # not ascending
    f"v1: {H}|1 ; rm -rf /",         # junk
    "v1: ../../etc|1",
])
def test_distribution_rejects_malformed(bad):
    with pytest.raises(LayoutError):
        parse_distribution(bad)


def test_distribution_size_limit():
    with pytest.raises(LayoutError):
        parse_distribution(b"x" * (5 * 1024 * 1024))


def test_manifest_sign_verify_roundtrip():
    key = generate_key()
    m = _manifest()
    data = sign_manifest(m, key)
    assert verify_manifest(data, key.public_key(), expect_version=3) == m
    assert m.shard_offset(3) == 20


def test_forged_and_altered_manifests_rejected():
    key, attacker = generate_key(), generate_key()
    m = _manifest()
    # signed by someone else
    with pytest.raises(SignatureError):
        verify_manifest(sign_manifest(m, attacker), key.public_key())
    # a shard hash rewritten after signing
    env = json.loads(sign_manifest(m, key))
    env["manifest"]["shards"][1]["blake3"] = "ff" * 32
    with pytest.raises(SignatureError):
        verify_manifest(json.dumps(env).encode(), key.public_key())
    # a genuine manifest served under another version number (replay)
    with pytest.raises(SignatureError):
        verify_manifest(sign_manifest(m, key), key.public_key(), expect_version=4)


@pytest.mark.parametrize("mutate", [
    lambda b: b.update(size=26),                       # sizes inconsistent with shards
    lambda b: b.update(filename="../evil"),
    lambda b: b.update(extra=1),
    lambda b: b.update(version=-1),
    lambda b: b.update(version=1.5),
    lambda b: b["shards"][0].update(size=9),
    lambda b: b.update(shards=[]),
    lambda b: b.update(format="other/1"),
])
def test_manifest_schema_checked_even_when_signed(mutate):
    """A correctly signed but malformed body is still refused (defence in depth)."""
    key = generate_key()
    body = _manifest().to_dict()
    mutate(body)
    from swarmrl.shardcast.layout import canonical_json

    env = {"manifest": body, "signature": key.sign(canonical_json(body)).hex()}
    with pytest.raises(LayoutError):
        verify_manifest(json.dumps(env).encode(), key.public_key())


@pytest.mark.parametrize("data", [b"", b"not json", b"[]", b'{"manifest": {}}', b'{"manifest":{},"signature":"zz"}',
                                  b"{" * 100000, b"[" * 100000])
def test_garbage_manifest_envelopes_rejected(data):
    with pytest.raises(LayoutError):
        verify_manifest(data, generate_key().public_key())


def test_key_files(tmp_path):
    pub = keygen(tmp_path / "o.key")
    assert load_public_key(tmp_path / "o.key.pub") is not None
    assert public_key_hex(load_public_key(pub)) == pub
    assert public_key_hex(load_private_key(tmp_path / "o.key")) == pub
    assert (tmp_path / "o.key").stat().st_mode & 0o077 == 0
    assert (tmp_path / "o.key").read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")  # one format: PEM
    with pytest.raises(FileExistsError):
        keygen(tmp_path / "o.key")  # never overwrites a key
    legacy = generate_key()  # raw 64-hex seed files from earlier origins still load
    from cryptography.hazmat.primitives import serialization

    raw = legacy.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    (tmp_path / "legacy.key").write_text(raw.hex() + "\n")
    assert public_key_hex(load_private_key(tmp_path / "legacy.key")) == public_key_hex(legacy)
    (tmp_path / "junk.key").write_text("-----BEGIN PRIVATE KEY-----\nnope\n")
    with pytest.raises(ValueError):
        load_private_key(tmp_path / "junk.key")
    with pytest.raises(ValueError):
        load_public_key("not-a-key")


def test_origin_publishes_again_a_version_whose_publication_crashed(tmp_path):
    """A crash mid-publish leaves the version reserved but never served: the next origin publishes it instead
    of refusing it for good (a restarted trainer could otherwise never hand that policy to its relays);
    a crash after the rename but before distribution.txt is repaired at start."""
    from swarmrl.shardcast import Origin
    from swarmrl.shardcast.layout import DISTRIBUTION_NAME, parse_distribution
    from swarmrl.shardcast.server.origin import STATE_NAME

    ckpt = tmp_path / "model.bin"
    ckpt.write_bytes(bytes(range(256)) * 12)
    o = Origin(tmp_path / "o", keep=3, shard_size=1024, fsync=False)
    o.publish_sync(ckpt, version=1)
    # v2 reserved (persisted first), then the crash before its publication finished
    (tmp_path / "o" / STATE_NAME).write_text(json.dumps({"last_version": 2, "completed": 1}))
    (tmp_path / "o" / "v2.tmp").mkdir()
    o.close()
    o = Origin(tmp_path / "o", keep=3, shard_size=1024, fsync=False)
    assert o.last_version == 2 and not o.is_published(2)
    o.publish_sync(ckpt, version=2)
    assert o.is_published(2) and o.versions() == [1, 2]
    with pytest.raises(ValueError):
        o.publish_sync(ckpt, version=2)  # once published, never again
    with pytest.raises(ValueError):
        o.publish_sync(ckpt, version=1)
    o.publish_sync(ckpt, version=3)
    dist = tmp_path / "o" / DISTRIBUTION_NAME
    dist.write_bytes(b"".join(line + b"\n" for line in dist.read_bytes().splitlines()[:-1]))  # v3 unlisted
    o.close()
    o = Origin(tmp_path / "o", keep=3, shard_size=1024, fsync=False)
    assert [e.version for e in parse_distribution(dist.read_bytes())] == [1, 2, 3]
    o.close()
