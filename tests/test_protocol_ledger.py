"""Ledger rules (append-only, challenge window, slashing revokes only in-window credits), nonce
expiry, and the OpenAPI document of the API."""

from __future__ import annotations

import time

import pytest
from protocol_support import make_cfg

from swarmrl.protocol.orchestrator import Orchestrator, ProtocolError, SignedRequest, create_app, ledger
from swarmrl.protocol.signing import generate_key, sign_request
from swarmrl.protocol.tables import LedgerEntry, Nonce


def test_slash_revokes_only_credits_inside_the_window(tmp_path):
    cfg, _ = make_cfg(tmp_path)
    orch = Orchestrator(cfg)
    t0 = 1_000_000.0
    with orch.db.tx() as s:
        ledger.add(s, "n1", "stake", 100.0, now=t0)
        old = ledger.credit(s, "n1", 5.0, submission_id=1, window_s=10.0, now=t0)  # unlocks at t0+10
        new = ledger.credit(s, "n1", 7.0, submission_id=2, window_s=10.0, now=t0 + 8)  # unlocks at t0+18
        ledger.credit(s, "n2", 3.0, submission_id=3, window_s=10.0, now=t0 + 8)  # another node: untouched
    with orch.db.tx() as s:
        b = ledger.balances(s, "n1", now=t0 + 12)
        assert (b.stake, b.credits_locked, b.credits_unlocked) == (100.0, 7.0, 5.0)
        res = ledger.slash(s, "n1", 0.3, "forged", now=t0 + 12)
        assert res.slashed == pytest.approx(30.0) and res.revoked == 7.0
    with orch.db.tx() as s:
        b = ledger.balances(s, "n1", now=t0 + 12)
        assert (b.stake, b.credits_locked, b.credits_unlocked) == (pytest.approx(70.0), 0.0, 5.0)
        assert ledger.balances(s, "n2", now=t0 + 12).credits_locked == 3.0
        revoke = [r for r in s.query(LedgerEntry).filter_by(node_id="n1", kind="revoke")]
        assert [r.ref_id for r in revoke] == [new.id] and old.id != new.id
        # a second slash finds nothing left to revoke and takes a fraction of what remains
        res = ledger.slash(s, "n1", 0.5, "again", now=t0 + 13)
        assert res.revoked == 0.0 and res.slashed == pytest.approx(35.0)


def test_ledger_is_append_only(tmp_path):
    cfg, _ = make_cfg(tmp_path)
    orch = Orchestrator(cfg)
    with orch.db.tx() as s:
        row_id = ledger.add(s, "n1", "stake", 100.0).id
    with pytest.raises(PermissionError):
        with orch.db.tx() as s:
            s.get(LedgerEntry, row_id).amount = 1e9
    with pytest.raises(PermissionError):
        with orch.db.tx() as s:
            s.delete(s.get(LedgerEntry, row_id))
    with orch.db.tx() as s:
        assert s.get(LedgerEntry, row_id).amount == 100.0


def test_nonces_expire_and_stale_requests_stay_refused(tmp_path):
    cfg, _ = make_cfg(tmp_path, max_clock_skew_s=30.0)
    orch = Orchestrator(cfg)
    k = generate_key()
    body = b"{}"
    h = sign_request(k, "POST", "/v1/nodes/register", body)
    call = SignedRequest("POST", "/v1/nodes/register", h, None)
    orch.auth.authenticate(call, ("worker",), allow_unregistered=True)
    with pytest.raises(ProtocolError, match="replayed"):
        orch.auth.authenticate(call, ("worker",), allow_unregistered=True)
    with orch.db.tx() as s:
        assert s.query(Nonce).count() == 1
    later = time.time() + 120
    orch.membership.sweep(now=later)
    with orch.db.tx() as s:
        assert s.query(Nonce).count() == 0  # expired nonces are dropped...
    with pytest.raises(ProtocolError, match="stale"):  # ...because their timestamp is refused anyway
        orch.auth.authenticate(call, ("worker",), allow_unregistered=True, now=later)


def test_openapi_documents_bodies(tmp_path):
    cfg, _ = make_cfg(tmp_path)
    spec = create_app(cfg, run_sweeper=False).openapi()
    paths = spec["paths"]
    for p in ("/v1/nodes/register", "/v1/nodes/heartbeat", "/v1/submissions/upload/{assignment_id}",
              "/v1/validator/pending", "/v1/validator/verdicts", "/v1/trainer/step",
              "/v1/trainer/steps/{step}/submissions", "/v1/nodes/{node_id}/ledger"):
        assert p in paths, p
    schemas = spec["components"]["schemas"]
    for name in ("RegisterRequest", "HeartbeatRequest", "HeartbeatReply", "AssignmentSpec", "VerdictRequest",
                 "VerdictReply", "SubmitReply", "Balance", "ErrorBody"):
        assert name in schemas, name
    hb = paths["/v1/nodes/heartbeat"]["post"]
    assert hb["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("HeartbeatRequest")
    up = paths["/v1/submissions/upload/{assignment_id}"]["put"]
    assert "application/octet-stream" in up["requestBody"]["content"]


def test_multi_process_serving_needs_postgres(tmp_path):
    from swarmrl.protocol.orchestrator import serve

    cfg, _ = make_cfg(tmp_path, workers=2, database_url="")
    with pytest.raises(ValueError, match="PostgreSQL"):
        serve(cfg)
