"""Signed requests: the pure scheme, and accept/reject cases against a real orchestrator socket."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from protocol_support import make_cfg, running

from swarmrl.protocol.client import ApiError, NodeClient
from swarmrl.protocol.signing import (
    H_HASH,
    H_KEY,
    H_NONCE,
    H_SIG,
    H_TS,
    SignatureError,
    generate_key,
    load_private_key,
    node_id_for,
    parse_headers,
    public_key_hex,
    save_private_key,
    sign_request,
    verify_signature,
)


def test_sign_verify_roundtrip_and_tamper():
    k = generate_key()
    h = sign_request(k, "POST", "/v1/x?a=1", b'{"a": 1}')
    parsed = parse_headers(h)
    verify_signature(parsed, "POST", "/v1/x?a=1")
    assert parsed.node_id == node_id_for(public_key_hex(k))
    for method, path in (("PUT", "/v1/x?a=1"), ("POST", "/v1/x?a=2"), ("POST", "/v1/y?a=1")):
        with pytest.raises(SignatureError):
            verify_signature(parsed, method, path)
    other = dict(h)
    other[H_HASH] = "0" * 64
    with pytest.raises(SignatureError):
        verify_signature(parse_headers(other), "POST", "/v1/x?a=1")
    missing = {k2: v for k2, v in h.items() if k2 != H_NONCE}
    with pytest.raises(SignatureError, match="missing"):
        parse_headers(missing)


def test_key_file_roundtrip(tmp_path):
    k = generate_key()
    p = save_private_key(k, tmp_path / "node.pem")
    assert (p.stat().st_mode & 0o777) == 0o600
    assert public_key_hex(load_private_key(p)) == public_key_hex(k)
    with pytest.raises(FileExistsError):
        save_private_key(generate_key(), p)


def _post(url: str, path: str, body: bytes, headers: dict) -> httpx.Response:
    return httpx.post(url + path, content=body, headers={**headers, "Content-Type": "application/json"})


@pytest.fixture()
def server(tmp_path):
    cfg, keys = make_cfg(tmp_path, rate_limit_per_s=5.0, rate_limit_burst=5, max_json_bytes=4096)
    with running(cfg, run_sweeper=False) as srv:
        yield srv, keys


def test_signed_request_rejections(server):
    srv, keys = server
    node_key = generate_key()
    nc = NodeClient(srv.url, node_key)
    nc.register(throughput=100.0, stake=150.0)
    body = json.dumps({"status": {}}).encode()
    path = "/v1/nodes/heartbeat"

    ok = sign_request(node_key, "POST", path, body)
    assert _post(srv.url, path, body, ok).status_code == 200
    # replayed nonce (exact same signed request again)
    r = _post(srv.url, path, body, ok)
    assert r.status_code == 401 and "replayed nonce" in r.json()["detail"]
    # stale timestamp
    stale = sign_request(node_key, "POST", path, body, timestamp=int(time.time()) - 3600)
    r = _post(srv.url, path, body, stale)
    assert r.status_code == 401 and "stale timestamp" in r.json()["detail"]
    # tampered body: signed over one body, another sent
    h = sign_request(node_key, "POST", path, body)
    r = _post(srv.url, path, json.dumps({"status": {"evil": 1}}).encode(), h)
    assert r.status_code == 401 and "content hash" in r.json()["detail"]
    # wrong key: claims the node's public key but is signed by another key
    impostor = generate_key()
    h = sign_request(impostor, "POST", path, body)
    h[H_KEY] = public_key_hex(node_key)
    r = _post(srv.url, path, body, h)
    assert r.status_code == 401 and "does not verify" in r.json()["detail"]
    # unknown key: valid signature, never registered
    r = _post(srv.url, path, body, sign_request(generate_key(), "POST", path, body))
    assert r.status_code == 401 and "unknown key" in r.json()["detail"]
    # signature bound to the path: replay the headers on another endpoint
    h = sign_request(node_key, "POST", path, body)
    r = _post(srv.url, "/v1/nodes/register", body, h)
    assert r.status_code == 401
    # malformed headers
    h = sign_request(node_key, "POST", path, body)
    h[H_SIG] = "zz"
    assert _post(srv.url, path, body, h).status_code == 401
    h = sign_request(node_key, "POST", path, body)
    h[H_TS] = "yesterday"
    assert _post(srv.url, path, body, h).status_code == 401
    # a node may not call validator endpoints
    with pytest.raises(ApiError) as e:
        nc.request("GET", "/v1/validator/pending")
    assert e.value.status == 403


def test_ejected_key_refused(server):
    srv, keys = server
    nc = NodeClient(srv.url, generate_key())
    nc.register(throughput=10.0, stake=100.0)
    with srv.orch.db.tx() as s:
        from swarmrl.protocol.tables import Node

        s.get(Node, nc.node_id).status = "ejected"
    with pytest.raises(ApiError) as e:
        nc.heartbeat()
    assert e.value.status == 403 and "ejected" in e.value.detail
    with pytest.raises(ApiError) as e:  # and cannot come back under the same key
        nc.register(throughput=10.0, stake=100.0)
    assert e.value.status == 403


def test_rate_limit_and_body_cap(server):
    srv, keys = server
    nc = NodeClient(srv.url, generate_key())
    nc.register(throughput=10.0, stake=100.0)
    codes = []
    for _ in range(12):
        try:
            nc.heartbeat()
            codes.append(200)
        except ApiError as e:
            codes.append(e.status)
    assert 429 in codes and codes[0] == 200
    big = b'{"status": {"x": "' + b"a" * 10_000 + b'"}}'
    r = _post(srv.url, "/v1/nodes/heartbeat", big, sign_request(nc.key, "POST", "/v1/nodes/heartbeat", big))
    assert r.status_code == 413


def test_hostile_inputs_get_clear_4xx(server):
    srv, keys = server
    nc = NodeClient(srv.url, generate_key())
    nc.register(throughput=10.0, stake=100.0)
    for path in (f"/v1/submissions/upload/{10**30}", "/v1/submissions/upload/-1", "/v1/submissions/upload/abc"):
        h = sign_request(nc.key, "PUT", path, b"x")
        r = httpx.put(srv.url + path, content=b"x", headers=h)
        assert r.status_code == 422, (path, r.status_code)
    path = "/v1/nodes/heartbeat"
    for body in (b"not json", b'{"status": 5}', b'{"unknown": 1}', b"\xff\xfe"):
        r = _post(srv.url, path, body, sign_request(nc.key, "POST", path, body))
        assert r.status_code == 422, (body, r.status_code)
    r = httpx.get(srv.url + "/v1/nodes/" + "x" * 5000 + "/ledger")
    assert r.status_code == 404
