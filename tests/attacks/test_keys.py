"""Small-order and non-canonical Ed25519 public keys: anyone can "sign" for a small-order key (R = a torsion
point, S = 0 verifies for any message under OpenSSL), so such a key must never become a node, a validator,
a trainer or a SHARDCAST origin. Refused when parsed: at registration over HTTP, in config key lists and
for manifests."""

from __future__ import annotations

import hashlib
import json
import secrets
import time

import httpx
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from protocol_support import make_cfg, running
from pydantic import ValidationError

from swarmrl.protocol.client import NodeClient
from swarmrl.protocol.config import OrchestratorConfig, ValidatorConfig
from swarmrl.protocol.signing import canonical_message, generate_key, node_id_for, public_key_hex
from swarmrl.shardcast.layout import LayoutError, Manifest, canonical_json
from swarmrl.shardcast.signing import load_public_key, verify_manifest

P = 2**255 - 19
D = (-121665 * pow(121666, P - 2, P)) % P

# the 8 points of order dividing 8 (canonical encodings), from the curve itself (see test_the_list_is_the_torsion)
SMALL = [bytes.fromhex(h) for h in (
    "0100000000000000000000000000000000000000000000000000000000000000",
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "0000000000000000000000000000000000000000000000000000000000000000",
    "0000000000000000000000000000000000000000000000000000000000000080",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",
)]
# non-canonical: y = p + 1 (the identity again), y = p (order 4), and the identity with the sign bit on x = 0
NON_CANONICAL = [(P + 1).to_bytes(32, "little"), P.to_bytes(32, "little"),
                 bytes.fromhex("0100000000000000000000000000000000000000000000000000000000000080")]


def _decode(raw: bytes) -> tuple[int, int]:
    n = int.from_bytes(raw, "little")
    sign, y = n >> 255, n & ((1 << 255) - 1)
    u, v = (y * y - 1) % P, (D * y * y + 1) % P
    x2 = u * pow(v, P - 2, P) % P
    x = pow(x2, (P + 3) // 8, P)
    if x * x % P != x2:
        x = x * pow(2, (P - 1) // 4, P) % P
    assert x * x % P == x2, "not on the curve"
    if x & 1 != sign:
        x = (P - x) % P
    return x, y


def _double(pt: tuple[int, int]) -> tuple[int, int]:
    x, y = pt
    t = D * x * x * y * y % P
    return 2 * x * y * pow(1 + t, P - 2, P) % P, (y * y + x * x) * pow(1 - t, P - 2, P) % P


def test_the_list_is_the_torsion():
    """Eight distinct canonical points each of order dividing 8: exactly the torsion subgroup."""
    pts = {_decode(k) for k in SMALL}
    assert len(pts) == 8
    for pt in pts:
        assert _double(_double(_double(pt))) == (0, 1)


def _forged_headers(key: bytes, method: str, path: str, body: bytes) -> dict[str, str]:
    """Signature headers for ``key`` without its private key: R = a torsion point, S = 0; the nonce is varied
    until OpenSSL verifies it (for the identity every message works; for the others 1 in 8 or so)."""
    pub = Ed25519PublicKey.from_public_bytes(key)
    digest = hashlib.sha256(body).hexdigest()
    ts = int(time.time())
    for _ in range(256):
        nonce = secrets.token_hex(16)
        msg = canonical_message(method, path, digest, ts, nonce)
        for r in SMALL:
            sig = r + bytes(32)
            try:
                pub.verify(sig, msg)
            except InvalidSignature:
                continue
            return {"X-Swarm-Key": key.hex(), "X-Swarm-Timestamp": str(ts), "X-Swarm-Nonce": nonce,
                    "X-Swarm-Content-SHA256": digest, "X-Swarm-Signature": sig.hex(),
                    "Content-Type": "application/json"}
    pytest.skip(f"no forged signature found for {key.hex()[:8]} (OpenSSL refuses it)")


def test_a_small_order_key_verifies_anything():
    """Why it matters: the identity key "signs" every message with R = identity, S = 0."""
    pub = Ed25519PublicKey.from_public_bytes(SMALL[0])
    for msg in (b"register me", b"a verdict: accept", b"anything"):
        pub.verify(SMALL[0] + bytes(32), msg)


@pytest.mark.parametrize("key", SMALL + NON_CANONICAL, ids=lambda k: k.hex()[:8] + ".." + k.hex()[-2:])
def test_registration_refused_over_http(tmp_path, key):
    cfg, _ = make_cfg(tmp_path)
    body = json.dumps({"hardware": {}, "throughput": 10.0, "stake": 200.0}).encode()
    path = "/v1/nodes/register"
    with running(cfg, run_sweeper=False) as srv:
        try:
            headers = _forged_headers(key, "POST", path, body)
        except ValueError:  # OpenSSL cannot even load it: refused either way
            headers = {"X-Swarm-Key": key.hex(), "X-Swarm-Timestamp": str(int(time.time())),
                       "X-Swarm-Nonce": secrets.token_hex(16), "X-Swarm-Content-SHA256": "0" * 64,
                       "X-Swarm-Signature": "00" * 64, "Content-Type": "application/json"}
        r = httpx.post(srv.url + path, content=body, headers=headers, timeout=10)
        assert r.status_code == 401, (r.status_code, r.text)
        detail = r.json()["detail"]
        assert "small order" in detail or "non-canonical" in detail, detail
        assert httpx.get(f"{srv.url}/v1/nodes/{node_id_for(key.hex())}", timeout=10).status_code == 404
        # an honest key still registers (the check refuses only the bad ones)
        NodeClient(srv.url, generate_key()).register(throughput=10.0, stake=200.0)


@pytest.mark.parametrize("key", SMALL + NON_CANONICAL[:2], ids=lambda k: k.hex()[:8] + ".." + k.hex()[-2:])
def test_config_key_lists_refuse_them(key):
    good = public_key_hex(generate_key())
    OrchestratorConfig(validator_keys=[good], trainer_keys=[good])
    for field in ("validator_keys", "trainer_keys"):
        with pytest.raises(ValidationError, match="small order|non-canonical"):
            OrchestratorConfig(**{field: [good, key.hex()]})
    assert ValidatorConfig()  # unaffected


def _manifest() -> Manifest:
    import blake3

    from swarmrl.shardcast.layout import ShardInfo

    data = b"forged policy weights"
    h = blake3.blake3(data).hexdigest()
    return Manifest(version=1, size=len(data), shard_size=1 << 20, blake3=h, shards=(ShardInfo(len(data), h),))


def test_manifest_under_a_small_order_origin_key_is_refused(tmp_path):
    """A relay or node pinned to a small-order origin key would take any forged manifest as signed."""
    body = _manifest().to_dict()
    forged = json.dumps({"manifest": body, "signature": (SMALL[0] + bytes(32)).hex()}).encode()
    Ed25519PublicKey.from_public_bytes(SMALL[0]).verify(SMALL[0] + bytes(32), canonical_json(body))  # OpenSSL: ok
    (tmp_path / "origin.pub").write_text(SMALL[0].hex() + "\n")
    for spec in (SMALL[0].hex(), str(tmp_path / "origin.pub"), Ed25519PublicKey.from_public_bytes(SMALL[0])):
        with pytest.raises(ValueError, match="small order"):
            load_public_key(spec)
        with pytest.raises(LayoutError, match="small order"):
            verify_manifest(forged, spec, expect_version=1)
    for bad in NON_CANONICAL[:2]:
        with pytest.raises(ValueError, match="non-canonical"):
            load_public_key(bad.hex())
    # an honest origin key is unaffected
    from swarmrl.shardcast.signing import sign_manifest

    key = generate_key()
    assert verify_manifest(sign_manifest(_manifest(), key), public_key_hex(key), expect_version=1).version == 1
