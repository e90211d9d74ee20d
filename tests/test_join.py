"""Joining from a URL alone (issue 39): the signed run description, the base model as SHARDCAST version 0, and
`swarmrl node join`'s refusals, each one line and an exit status, nothing half-written left behind."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from protocol_support import make_cfg, running

from swarmrl.models.bundle import BundleError, bundle_hash, extract_bundle, write_bundle
from swarmrl.policy.base import BaseUnavailable, ensure_base
from swarmrl.protocol.client import ApiError, NodeClient, TrainerClient
from swarmrl.protocol.description import (
    MAX_DESCRIPTION_BYTES,
    DescriptionError,
    RunDescription,
    sign_description,
    verify_description,
)
from swarmrl.protocol.signing import generate_key, public_key_hex
from swarmrl.rl.publish import publish_base
from swarmrl.shardcast import Origin
from swarmrl.shardcast.layout import parse_distribution
from swarmrl.swarm.join import JoinRefused, read_description

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "swarmrl", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


# ---- the description ------------------------------------------------------------------------------------------
def _signed(key=None, **over) -> tuple[bytes, str]:  # noqa: ANN001
    key = key or generate_key()
    d = RunDescription(orchestrator_key=public_key_hex(key), contract={}, heartbeat_interval_s=10.0,
                       heartbeats_per_interval=10, min_stake=100.0, issued_at=1, **over)
    return sign_description(d, key).model_dump_json().encode(), public_key_hex(key)


def test_a_description_verifies_under_its_key_and_carries_the_sampling_settings():
    raw, pub = _signed()
    d = verify_description(raw, pub)
    assert d.contract.sampling.temperature == 1.0 and d.min_stake == 100.0


def test_a_description_signed_by_another_key_is_refused_with_the_reason():
    raw, _ = _signed()
    with pytest.raises(DescriptionError, match="not the run key"):
        verify_description(raw, public_key_hex(generate_key()))


def test_a_tampered_description_does_not_verify():
    raw, pub = _signed()
    doc = json.loads(raw)
    doc["description"]["contract"]["sampling"]["temperature"] = 0.5  # a relay in the middle lowers the temperature
    with pytest.raises(DescriptionError, match="signature does not verify"):
        verify_description(json.dumps(doc).encode(), pub)


@pytest.mark.parametrize("raw,why", [
    (b"x" * (MAX_DESCRIPTION_BYTES + 1), "over"),
    (b"{not json", "not JSON"),
    (b'{"description": {}, "signature": "00"}', "no orchestrator key"),
    (b"[1, 2]", "not a signed run description"),
    (b'{"description": {"orchestrator_key": 1}, "signature": NaN}', "not JSON"),
])
def test_malformed_descriptions_are_refused(raw, why):
    with pytest.raises(DescriptionError, match=why):
        verify_description(raw)


def test_a_description_with_unknown_fields_is_refused_even_when_signed():
    key = generate_key()
    raw, pub = _signed(key)
    doc = json.loads(raw)
    doc["description"]["extra"] = 1
    from swarmrl.protocol.description import _message

    doc["signature"] = key.sign(_message(doc["description"])).hex()
    with pytest.raises(DescriptionError, match="schema"):
        verify_description(json.dumps(doc).encode(), pub)


def test_the_orchestrator_serves_its_signed_description(tmp_path):
    cfg, _ = make_cfg(tmp_path, contract={"sampling": {"temperature": 0.7, "max_new_tokens": 12}})
    with running(cfg) as srv:
        d = read_description(srv.url, srv.orch.describer.public_key)
        assert d.contract.sampling.temperature == pytest.approx(0.7) and d.contract.sampling.max_new_tokens == 12
        assert d.contract == cfg.contract and d.base is None
        # the key is the orchestrator's own, kept across restarts (the join line stays valid)
        assert (Path(cfg.data_dir) / "orchestrator.pem").is_file()
    with running(cfg) as srv:
        assert srv.orch.describer.public_key == d.orchestrator_key
        with pytest.raises(JoinRefused, match="not the run key"):
            read_description(srv.url, public_key_hex(generate_key()))


def test_registration_with_another_base_model_is_refused_for_that_reason(tmp_path):
    cfg, keys = make_cfg(tmp_path)
    with running(cfg) as srv:
        with TrainerClient(srv.url, keys["trainer"]) as t:
            t.set_weights(["http://127.0.0.1:1"], public_key_hex(generate_key()), base={"blake3": "ab" * 32,
                                                                                      "bytes": 10})
        assert read_description(srv.url).base.blake3 == "ab" * 32
        with NodeClient(srv.url, generate_key()) as n:
            with pytest.raises(ApiError) as e:
                n.register(throughput=10.0, stake=100.0, base_model="cd" * 32)
            assert e.value.status == 422 and "serves base model cdcdcdcd" in e.value.detail
            n.register(throughput=10.0, stake=100.0, base_model="ab" * 32)


# ---- the base model bundle -------------------------------------------------------------------------------------
def test_a_bundle_is_deterministic_and_its_hash_is_the_written_files(tiny_model_dir, tmp_path):
    h1, n1 = bundle_hash(tiny_model_dir)
    h2, n2 = write_bundle(tiny_model_dir, tmp_path / "b.tar")
    assert (h1, n1) == (h2, n2)
    os.utime(tiny_model_dir / "config.json", (1, 1))  # times do not count
    assert bundle_hash(tiny_model_dir)[0] == h1
    out = extract_bundle(tmp_path / "b.tar", tmp_path / "m", max_bytes=n1)
    assert bundle_hash(out)[0] == h1


def _tar(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for ti, data in members:
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    if kind == tarfile.SYMTYPE:
        ti.linkname = "/etc/passwd"
    return ti


@pytest.mark.parametrize("members,why", [
    ([(_member("../evil.json"), b"{}")], "not a plain model file"),
    ([(_member("sub/config.json"), b"{}")], "not a plain model file"),
    ([(_member("config.json", tarfile.SYMTYPE), b"")], "not a plain model file"),
    ([(_member("run.py"), b"import os")], "not a plain model file"),
    ([(_member("config.json"), b"{}"), (_member("config.json"), b"{}")], "twice"),
    ([(_member("config.json"), b"{}"), (_member("w.safetensors"), b"x" * 200)], "more than"),
    ([(_member("config.json"), b"{}")], "no .safetensors"),
])
def test_hostile_bundles_are_refused_and_leave_nothing(tmp_path, members, why):
    (tmp_path / "b.tar").write_bytes(_tar(members))
    with pytest.raises(BundleError, match=why):
        extract_bundle(tmp_path / "b.tar", tmp_path / "m", max_bytes=100)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.tar"]
    assert not (tmp_path.parent / "evil.json").exists()


# ---- version 0 through SHARDCAST ---------------------------------------------------------------------------------
def test_version_0_is_kept_beside_the_newest_versions(tiny_model_dir, tmp_path):
    o = Origin(tmp_path / "origin", keep=2, shard_size=1 << 16)
    blake, size = publish_base(o, tiny_model_dir)
    assert (blake, size) == bundle_hash(tiny_model_dir)
    f = tmp_path / "w.bin"
    for v in (1, 2, 3):
        f.write_bytes(os.urandom(1000))
        o.publish_sync(f, v)
    listed = [e.version for e in parse_distribution((tmp_path / "origin" / "distribution.txt").read_bytes())]
    assert listed == [0, 2, 3]
    assert publish_base(o, tiny_model_dir) == (blake, size)  # once: a restarted trainer finds it published


def test_a_node_fetches_version_0_checks_its_hash_and_then_holds_it(tiny_model_dir, tmp_path):
    o = Origin(tmp_path / "origin", keep=2, shard_size=1 << 16)
    blake, size = publish_base(o, tiny_model_dir)
    url = o.serve()
    try:
        cache = tmp_path / "cache"
        # another hash than the run's: refused from the signed manifest, before any shard; nothing left
        with pytest.raises(BaseUnavailable, match="is not the expected"):
            ensure_base("00" * 32, size, [url], o.public_key, cache)
        assert not any(p.is_file() for p in cache.rglob("*"))
        d, got = ensure_base(blake, size, [url], o.public_key, cache)
        assert got["source"] == "fetched" and got["bytes"] == size and bundle_hash(d)[0] == blake
        assert not list(cache.rglob("*.tar"))
        assert ensure_base(blake, size, [url], o.public_key, cache)[1]["source"] == "cached"
        # a machine that holds the same files downloads nothing
        assert ensure_base(blake, size, [], "", tmp_path / "c2", local=[tiny_model_dir])[1]["source"] == "local"
        # a manifest signed by another key than the run names: refused
        with pytest.raises(BaseUnavailable):
            ensure_base(blake, size, [url], public_key_hex(generate_key()), tmp_path / "c3", wait_s=0.5)
    finally:
        o.close()


# ---- `swarmrl node join`: refusals --------------------------------------------------------------------------------
def test_join_to_an_orchestrator_that_does_not_answer_is_one_line_and_leaves_nothing(tmp_path):
    r = _cli("node", "join", "http://127.0.0.1:9", "--work-dir", "w", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not answer" in lines[0], r.stderr
    assert not (tmp_path / "w").exists()


def test_join_refuses_a_run_whose_task_needs_a_package_missing_here_before_registering(tmp_path):
    cfg, _ = make_cfg(tmp_path, contract={"task": {"name": "vf:swarmrl-no-such-env"}})
    with running(cfg) as srv:
        r = _cli("node", "join", srv.url, "--work-dir", "w", cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        assert "pip install 'swarmrl-no-such-env'" in r.stderr, r.stderr
        assert [ln for ln in r.stderr.splitlines() if ln.startswith("error:")] == [r.stderr.strip().splitlines()[-1]]
        assert not (tmp_path / "w").exists()  # no key made, nothing registered


def test_join_refuses_a_description_signed_by_another_key(tmp_path):
    cfg, _ = make_cfg(tmp_path)
    with running(cfg) as srv:
        r = _cli("node", "join", srv.url, "--run-key", public_key_hex(generate_key()), "--work-dir", "w",
                 cwd=tmp_path)
        assert r.returncode == 1 and "not the run key" in r.stderr, r.stderr
        assert not (tmp_path / "w").exists()


def test_join_before_the_base_model_is_published_says_so(tmp_path):
    cfg, _ = make_cfg(tmp_path)
    with running(cfg) as srv:
        r = _cli("node", "join", srv.url, "--work-dir", "w", "--set", "base_wait_s=1", cwd=tmp_path)
        assert r.returncode == 1 and "has not published its base model" in r.stderr, r.stderr


def test_an_answer_too_large_is_refused_before_it_is_all_read(tmp_path):
    """A hostile URL that streams without end: refused once past the limit, not read to its end."""
    import http.server
    import threading

    sent = {"bytes": 0}

    class Endless(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(10_000):
                    self.wfile.write(b"x" * 65536)
                    sent["bytes"] += 65536
            except OSError:
                pass

        def log_message(self, *a):  # noqa: ANN002
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with pytest.raises(JoinRefused, match="over"):
            read_description(f"http://127.0.0.1:{srv.server_address[1]}")
        time.sleep(0.2)
        assert sent["bytes"] < 64 * MAX_DESCRIPTION_BYTES  # the client hung up early
    finally:
        srv.shutdown()


def test_a_remembered_run_key_holds_and_says_where_it_came_from(tmp_path):
    cfg, _ = make_cfg(tmp_path)
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "run_key").write_text(public_key_hex(generate_key()) + "\n")  # an earlier run's
    with running(cfg) as srv:
        r = _cli("node", "join", srv.url, "--work-dir", "w", cwd=tmp_path)
        assert r.returncode == 1 and "remembered in w/run_key" in r.stderr, r.stderr


def test_a_joined_node_waits_for_its_deposit_as_long_as_its_config_says(tmp_path):
    """A stranger sends its key and waits for the operator: registration keeps asking for ``deposit_wait_s``."""
    from swarmrl.swarm.config import JoinConfig
    from swarmrl.swarm.join import node_settings

    raw, _ = _signed(weights={"servers": [], "public_key": "ab" * 32})
    d = verify_description(raw)
    node, rl = node_settings(JoinConfig(orchestrator="http://x:1", deposit_wait_s=900), d, tmp_path,
                             tmp_path / "k.pem", tmp_path / "base")
    assert node.deposit_wait_s == 900 and node.stake == d.min_stake and rl.contract == d.contract
    assert JoinConfig().deposit_wait_s >= 300  # minutes, not the 60 s a node of the run's own waits
