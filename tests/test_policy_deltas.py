"""Full fine-tuning versions as deltas, end to end on loopback: the trainer's ``DeltaPublisher`` puts versions on its
SHARDCAST origin as keyframes and deltas, and a node's ``ShardcastPolicySource`` rebuilds each one bit for bit
(BLAKE3-equal to the file in the run directory) after a chain of deltas, after missing versions, joining late, and
after a restart mid-download; a forged, truncated, reordered or oversized delta, and a delta against a base the node
does not hold, are refused with the reason before the node's weights are touched."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import blake3
import pytest
import torch

from swarmrl.contract.weights import WeightsRule
from swarmrl.models import load_model
from swarmrl.models.io import save_inference_weights
from swarmrl.policy.sources import PolicyUnavailable, ShardcastPolicySource
from swarmrl.rl.publish import DeltaPublisher
from swarmrl.rundir.writer import RunDir
from swarmrl.shardcast.delta import delta_filename, encode_delta

torch.set_num_threads(1)


def _hash(p: Path) -> str:
    return blake3.blake3(p.read_bytes()).hexdigest()


class Swarm:
    """A run directory whose versions are a tiny model nudged a little each step, published by a ``DeltaPublisher``
    (shards of 4 KiB, so a delta spans several), and nodes that fetch them."""

    def __init__(self, tmp_path: Path, base: Path, rule: WeightsRule) -> None:
        self.tmp, self.base = tmp_path, base
        self.run = RunDir(tmp_path / "run")
        self.model = load_model(base)
        self.pub = DeltaPublisher(self.run, rule=rule, keep=rule.versions_to_serve(2), shard_size=4096)
        self.g = torch.Generator().manual_seed(0)
        self.version = 0

    def step(self, share: float = 0.05) -> Path:
        """The next version: ``share`` of each weight's elements moved by a step of ~1e-2 (the bfloat16 cast then
        changes most of those), committed and published; returns its weights file."""
        self.version += 1
        with torch.no_grad():
            for p in self.model.parameters():
                mask = torch.rand(p.shape, generator=self.g) < share
                p.add_(mask * torch.randn(p.shape, generator=self.g) * 1e-2)
        d = self.run.policies.staging_dir(self.version)
        save_inference_weights(self.model, d, "bfloat16", master_dir=d / "master")
        for f in self.base.iterdir():
            if f.is_file() and not f.name.endswith(".safetensors") and not (d / f.name).exists():
                shutil.copy2(f, d / f.name)
        self.run.commit_version(self.version, self.run.policies.staging_path(self.version))
        self.pub.publish(self.version, self.run.version_dir(self.version))
        self.pub.close()  # waits for it
        return self.run.version_dir(self.version) / "model.safetensors"

    def node(self, name: str = "node") -> ShardcastPolicySource:
        return ShardcastPolicySource([self.pub.url], self.pub.origin.public_key, self.tmp / name / "cache",
                                     self.base, keep=4)

    def published(self) -> list[dict]:
        return [json.loads(ln) for ln in (self.run.shardcast / "published.jsonl").read_text().splitlines()]

    def close(self) -> None:
        self.pub.origin.close()


@pytest.fixture()
def swarm(tmp_path, tiny_model_dir):
    s = Swarm(tmp_path, tiny_model_dir, WeightsRule(keyframe_every=4))
    yield s
    s.close()


def test_a_chain_of_deltas_a_missed_version_and_a_late_join_are_bit_exact(swarm):
    node = swarm.node()
    files = {}
    for _ in range(3):
        f = swarm.step()
        files[swarm.version] = f
        got = node.fetch(swarm.version, timeout_s=20)
        assert _hash(got / "model.safetensors") == _hash(files[swarm.version])
    report = node.take_fetch_report()
    assert report["path"] == ["delta:v3"] and report["bytes"] < files[3].stat().st_size / 3
    kinds = [(r["version"], r["kind"]) for r in swarm.published()]
    assert kinds == [(1, "keyframe"), (2, "delta"), (3, "delta")]
    assert all(0 < r["changed_share"] < 0.2 for r in swarm.published() if r["kind"] == "delta")
    # the published weights are the trainer's master weights cast to bfloat16, and a float32 holder holds them exactly
    held = load_model(got)
    for (k, a), b in zip(swarm.model.state_dict().items(), held.state_dict().values()):
        assert torch.equal(a.to(torch.bfloat16).float(), b), k

    files[4], files[5] = swarm.step(), swarm.step()  # keyframe_every=4: v5 is whole again
    assert [r["kind"] for r in swarm.published()][3:] == ["delta", "keyframe"]
    assert _hash(node.fetch(5, timeout_s=20) / "model.safetensors") == _hash(files[5])
    assert node.take_fetch_report()["path"] == ["keyframe:v5"]
    files[6], files[7] = swarm.step(), swarm.step()  # the node misses v6: it applies v6's delta, then v7's
    assert _hash(node.fetch(7, timeout_s=20) / "model.safetensors") == _hash(files[7])
    assert node.take_fetch_report()["path"] == ["delta:v6", "delta:v7"]

    late = swarm.node("late")  # joins holding nothing: the newest keyframe and the deltas after it
    assert _hash(late.fetch(7, timeout_s=20) / "model.safetensors") == _hash(files[7])
    assert late.take_fetch_report()["path"] == ["keyframe:v5", "delta:v6", "delta:v7"]


def test_a_delta_against_a_base_the_node_does_not_hold_is_refused_with_the_reason(swarm):
    swarm.step()
    v2 = swarm.step()
    node = swarm.node()
    node.fetch(1, timeout_s=20)
    held = node.local(1) / "model.safetensors"
    other = bytearray(held.read_bytes())
    other[-2:] = bytes([other[-2] ^ 1, other[-1]])  # the node's v1 is not the publisher's
    held.write_bytes(bytes(other))
    with pytest.raises(PolicyUnavailable, match="not the version held here"):
        node.fetch(2, timeout_s=5)
    assert held.read_bytes() == bytes(other) and node.local(2) is None
    # its base gone from every server (pruned: keep 5 here), a node holding nothing cannot reach v8 from v2's chain
    for _ in range(6):
        swarm.step()
    for v in (1, 2, 3):
        shutil.rmtree(swarm.pub.origin.root / f"v{v}", ignore_errors=True)
    (swarm.pub.origin.root / "distribution.txt").write_text(
        "".join(ln + "\n" for ln in (swarm.pub.origin.root / "distribution.txt").read_text().splitlines()
                if int(ln.split(":")[0][1:]) > 3))
    assert [r["kind"] for r in swarm.published()][:5] == ["keyframe", "delta", "delta", "delta", "keyframe"]
    late = swarm.node("late")
    assert _hash(late.fetch(6, timeout_s=20) / "model.safetensors") == _hash(
        swarm.run.version_dir(6) / "model.safetensors")  # from the keyframe v5
    assert v2.exists()
    # v4 is a delta against v3, gone from every server: a node holding nothing is told so
    with pytest.raises(PolicyUnavailable, match="v4 is a delta against v3, which this node does not hold and no "
                                                "server offers"):
        swarm.node("later").fetch(4, timeout_s=3)


def _tamper_shards(swarm: Swarm, version: int, how: str) -> None:
    vdir = swarm.pub.origin.root / f"v{version}"
    shards = sorted(vdir.glob("shard_*.bin"))
    assert len(shards) >= 2, "the delta must span several shards"
    if how == "forged":
        b = bytearray(shards[0].read_bytes())
        b[100] ^= 0x40
        shards[0].write_bytes(bytes(b))
    elif how == "truncated":
        shards[-1].write_bytes(shards[-1].read_bytes()[:-7])
    elif how == "reordered":
        a, b = shards[0].read_bytes(), shards[1].read_bytes()
        shards[0].write_bytes(b)
        shards[1].write_bytes(a)


@pytest.mark.parametrize("how", ["forged", "truncated", "reordered"])
def test_a_tampered_delta_is_refused_before_it_touches_the_weights(swarm, how):
    swarm.step()
    node = swarm.node()
    node.fetch(1, timeout_s=20)
    before = _hash(node.local(1) / "model.safetensors")
    swarm.step(share=0.5)  # a delta of several 4 KiB shards
    assert swarm.published()[-1]["kind"] == "delta"
    _tamper_shards(swarm, 2, how)
    with pytest.raises(PolicyUnavailable):
        node.fetch(2, timeout_s=3)
    assert _hash(node.local(1) / "model.safetensors") == before and node.local(2) is None


def test_an_oversized_or_malformed_signed_delta_is_refused(swarm, tmp_path):
    """A delta the origin itself signed (a broken publisher): larger than a whole version, refused from its manifest
    before any shard; malformed inside, refused when applied, the base untouched."""
    v1 = swarm.step()
    node = swarm.node()
    node.fetch(1, timeout_s=20)
    big = tmp_path / "big"
    big.write_bytes(b"\0" * (v1.stat().st_size + 1))
    swarm.pub.origin.publish_sync(big, 2, filename=delta_filename(1))
    with pytest.raises(PolicyUnavailable, match="larger than a whole version"):
        node.fetch(2, timeout_s=3)
    good = encode_delta(v1.read_bytes(), v1.read_bytes())
    bad = tmp_path / "bad"
    bad.write_bytes(good[:-3] + b"xyz")  # its compressed values garbled
    swarm.pub.origin.publish_sync(bad, 3, filename=delta_filename(2))
    swarm.pub.origin.publish_sync(bad, 4, filename=delta_filename(1))
    with pytest.raises(PolicyUnavailable, match="refused"):
        node.fetch(4, timeout_s=3)
    assert node.local(4) is None and _hash(node.local(1) / "model.safetensors") == _hash(v1)


def test_a_node_restarted_mid_download_finishes_the_delta_bit_exact(swarm, monkeypatch):
    import swarmrl.shardcast.client.chain as chain

    swarm.step()
    node = swarm.node()
    node.fetch(1, timeout_s=20)
    v2 = swarm.step(share=0.5)
    real = chain.fetch

    class Crash(Exception):
        pass

    def crashing(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        def boom(done: int, total: int) -> None:
            if done >= 2:
                raise Crash
        return real(*a, **kw, on_shard=boom)

    monkeypatch.setattr(chain, "fetch", crashing)
    with pytest.raises(Crash):
        node.fetch(2, timeout_s=20)
    partial = list((node.cache / "v000002").glob("*.delta*"))
    assert partial, "the interrupted download left its verified shards"
    monkeypatch.setattr(chain, "fetch", real)
    restarted = swarm.node()  # a new process over the same cache
    assert _hash(restarted.fetch(2, timeout_s=20) / "model.safetensors") == _hash(v2)
    assert not list((restarted.cache / "v000002").glob("*.delta*"))


def test_a_keyframe_comes_when_the_deltas_since_the_last_would_outweigh_one(tmp_path, tiny_model_dir):
    s = Swarm(tmp_path, tiny_model_dir, WeightsRule(keyframe_every=1000))
    try:
        for _ in range(8):
            s.step(share=0.6)  # deltas of about half a version
        rows = s.published()
        chain = 0
        for r in rows:
            chain = 0 if r["kind"] == "keyframe" else chain + r["bytes"]
            assert chain <= r["full_bytes"]
        assert [r["kind"] for r in rows].count("keyframe") >= 3
        assert WeightsRule(keyframe_every=1000).versions_to_serve(5) == 1001
        assert WeightsRule(encoding="full").versions_to_serve(5) == 5
    finally:
        s.close()
