"""DiLoCo trusting no one, over HTTP: a real aggregator (uvicorn on a free port) reporting to a real orchestrator.

Bad input on the wire is refused with its status before it touches the outer state; an honest round publishes
the int8 mean and credits every uploader; a hostile upload among honest ones is slashed and ejected through the
orchestrator's ledger; the orchestrator's DiLoCo endpoint is idempotent and only validators may call it."""

from __future__ import annotations

import hashlib
import math
import struct

import httpx
import pytest
import torch
from diloco_trust_support import join, ledger, result, signed_post, swarm, tiny_cfg, upload
from safetensors.torch import save as st_save

from swarmrl.diloco.outer import OuterNesterov
from swarmrl.diloco.trust import wire
from swarmrl.diloco.trust.calibration import honest_rounds
from swarmrl.protocol.client import ApiError, NodeClient, ValidatorClient
from swarmrl.protocol.schemas import DilocoRejection, DilocoRoundRequest
from swarmrl.protocol.signing import generate_key, node_id_for, public_key_hex, sign_request

CFG = tiny_cfg()


@pytest.fixture(scope="module")
def real_pgs() -> list[torch.Tensor]:
    """Four ranks' pseudo-gradients after 5 AdamW steps of the tiny model from its fresh anchor (int8 round trip)."""
    return next(honest_rounds(CFG, 4, 1)).pgs


def _nid(key) -> str:  # noqa: ANN001
    return node_id_for(public_key_hex(key))


def _snapshot(s) -> tuple:  # noqa: ANN001
    """The outer state as served (anchor and momentum bytes, round, outer steps, digest) and the pending uploads."""
    run = s.http.get("/v1/diloco/run").json()
    st = wire.decode_state(s.http.get("/v1/diloco/state").content, s.rounds.numel)
    mom = b"" if st.momentum is None else st.momentum.numpy().tobytes()
    return (st.anchor.numpy().tobytes(), mom, st.round, st.outer_steps, st.anchor_digest), run["pending"], run["round"]


def _body(codes, scales, meta=None) -> bytes:  # noqa: ANN001
    run_meta = {"run_id": "test-run", "round": "0", **(meta or {})}
    return st_save({"codes": codes, "scales": scales}, metadata=run_meta)


def test_bad_uploads_are_refused_before_they_touch_the_outer_state(tmp_path, real_pgs):
    with swarm(tmp_path, CFG, n_workers=3) as s:
        a, b, stranger = s.workers
        assert join(s, a).status_code == 200 and join(s, b).status_code == 200
        before = _snapshot(s)
        chunk = s.rounds.chunk
        digest = s.http.get("/v1/diloco/run").json()["anchor_digest"]
        codes, scales = wire.quantize(real_pgs[0], chunk)
        meta = {"anchor_digest": digest}
        path = "/v1/diloco/rounds/0/contributions"
        limit = s.rounds.max_upload_bytes

        def post(body: bytes, key=a, **kw) -> int:  # noqa: ANN001
            return signed_post(s.http, key, kw.pop("path", path), body, **kw).status_code

        nan = scales.clone()
        nan[0] = float("nan")
        inf = scales.clone()
        inf[-1] = float("inf")
        huge = torch.full_like(scales, 3e38)  # finite scales whose dequantized values overflow
        cases = {
            "oversized (Content-Length)": (post(b"\0" * (limit + 1)), 413),
            "NaN scale": (post(_body(codes, nan, meta)), 422),
            "infinite scale": (post(_body(codes, inf, meta)), 422),
            "overflowing scales": (post(_body(codes.abs() + 1, huge, meta)), 422),
            "wrong round (path)": (post(_body(codes, scales, {**meta, "round": "3"}),
                                        path="/v1/diloco/rounds/3/contributions"), 409),
            "wrong round (metadata)": (post(_body(codes, scales, {**meta, "round": "1"})), 409),
            "another anchor": (post(_body(codes, scales, {"anchor_digest": "0" * 16})), 409),
            "another run": (post(_body(codes, scales, {**meta, "run_id": "other"})), 409),
            "wrong shape": (post(_body(codes[:-1].clone(), scales, meta)), 422),
            "wrong dtype": (post(_body(codes.view(torch.uint8).clone(), scales, meta)), 422),
            "extra tensor": (post(st_save({"codes": codes, "scales": scales, "x": torch.zeros(1)},
                                          metadata={"run_id": "test-run", "round": "0", **meta})), 422),
            "bad metadata": (post(_body(codes, scales, {**meta, "round": "-1"})), 422),
            "not safetensors": (post(b"\xff" * 64), 422),
            "huge header": (post(struct.pack("<Q", 1 << 40) + b"{}"), 422),
            "not a member (registered, not joined)": (post(_body(codes, scales, meta), key=stranger), 403),
            "not registered": (post(_body(codes, scales, meta), key=generate_key()), 403),
        }
        good = _body(codes, scales, meta)
        h = sign_request(a, "POST", path, good)
        cases["unsigned"] = (s.http.post(path, content=good).status_code, 401)
        bad_sig = {**h, "X-Swarm-Signature": ("0" if h["X-Swarm-Signature"][0] != "0" else "1")
                   + h["X-Swarm-Signature"][1:]}
        cases["bad signature"] = (s.http.post(path, content=good, headers=bad_sig).status_code, 401)
        cases["body not the signed one"] = (post(good, sign_body=good + b"x"), 401)

        def lying():  # no Content-Length: streamed past the bound (a body that lies about its size)
            for _ in range(limit // 65536 + 2):
                yield b"\0" * 65536
        hs = sign_request(a, "POST", path, b"", content_sha256=hashlib.sha256(b"x").hexdigest())
        cases["oversized (streamed, no length)"] = (s.http.post(path, content=lying(), headers=hs).status_code, 413)
        wrong = {k: v for k, v in cases.items() if v[0] != v[1]}
        assert not wrong, wrong
        assert _snapshot(s) == before  # anchor, momentum, pending uploads and round unchanged

        assert post(good, headers=None) == 202
        assert s.http.post(path, content=good, headers=h).status_code in (401, 409)  # a replayed request
        assert upload(s, a, real_pgs[0]).status_code == 409  # a second upload of the same member
        state, pending, rnd = _snapshot(s)
        assert state == before[0] and pending == [_nid(a)] and rnd == 0


def test_an_honest_round_publishes_the_int8_mean_and_credits_every_uploader(tmp_path, real_pgs):
    with swarm(tmp_path, CFG, n_workers=3) as s:
        for k in s.workers:
            assert join(s, k).status_code == 200
        anchor0 = s.rounds.outer.anchor.clone()
        for k, pg in zip(s.workers, real_pgs):
            assert upload(s, k, pg).status_code == 202
        res = result(s, 0)
        assert sorted(res.accepted) == sorted(_nid(k) for k in s.workers) and res.rejected == []
        mean = torch.stack(real_pgs[:3]).mean(0)
        upd = res.vector(s.rounds.chunk)
        # each upload and the published mean are int8 rounded: at most half a step of each, per chunk
        steps = torch.stack([wire.quantize(pg, s.rounds.chunk)[1] for pg in real_pgs[:3]]).max(0).values
        bound = (steps + res.scales) / 2 * 1.001
        err = (upd - mean).abs().view(-1)
        per_chunk = torch.nn.functional.pad(err, (0, len(bound) * s.rounds.chunk - err.numel())).view(len(bound), -1)
        assert (per_chunk.max(1).values <= bound).all()
        mine = OuterNesterov(anchor0, lr=CFG.outer_lr, momentum=CFG.outer_momentum)
        mine.step(upd)  # what every worker does with the published bytes
        assert wire.anchor_digest(mine.anchor) == res.anchor_digest_after == \
            s.http.get("/v1/diloco/run").json()["anchor_digest"]
        for k in s.workers:
            b = ledger(s, k, until=lambda b: b["credits_locked"] > 0)
            assert b["credits_locked"] == 1.0 and b["stake"] == 100.0 and b["status"] == "active"
            assert any(e["kind"] == "credit" and "DiLoCo run test-run round 0" in e["note"] for e in b["entries"])


@pytest.mark.parametrize("attack", ["sign_flip", "scale"])
def test_a_hostile_upload_is_slashed_and_ejected_and_the_honest_credited(tmp_path, real_pgs, attack):
    with swarm(tmp_path, CFG, n_workers=4) as s:
        for k in s.workers:
            assert join(s, k).status_code == 200
        hostile = -real_pgs[0] if attack == "sign_flip" else real_pgs[0] * 100
        sent = [hostile] + real_pgs[1:]
        for k, pg in zip(s.workers, sent):
            assert upload(s, k, pg).status_code == 202
        res = result(s, 0)
        bad, honest = s.workers[0], s.workers[1:]
        assert [r["node_id"] for r in res.rejected] == [_nid(bad)]
        assert res.rejected[0]["reason"].startswith("opposed" if attack == "sign_flip" else "scaled")
        assert sorted(res.accepted) == sorted(_nid(k) for k in honest)
        mean = torch.stack(real_pgs[1:]).mean(0)
        assert (res.vector(s.rounds.chunk) - mean).abs().max() < 0.05 * mean.abs().max()
        b = ledger(s, bad, until=lambda b: b["status"] == "ejected")
        assert b["status"] == "ejected" and b["stake"] == 50.0 and b["credits_locked"] == 0
        assert [e["kind"] for e in b["entries"]] == ["stake", "slash"]
        assert "DiLoCo run test-run round 0" in b["entries"][1]["note"]
        for k in honest:
            h = ledger(s, k, until=lambda b: b["credits_locked"] > 0)
            assert h["status"] == "active" and h["credits_locked"] == 1.0 and h["stake"] == 100.0
        before = _snapshot(s)
        assert upload(s, bad, real_pgs[0]).status_code == 403  # ejected: refused at round 1
        assert join(s, bad).status_code == 403
        assert _snapshot(s) == before and before[2] == 1


def test_the_orchestrator_endpoint_is_idempotent_and_for_validators_only(tmp_path):
    from protocol_support import make_cfg, running

    ocfg, keys = make_cfg(tmp_path, min_stake=10.0)
    with running(ocfg) as orch:
        w = [generate_key() for _ in range(3)]
        for k in w:
            with NodeClient(orch.url, k) as c:
                c.register(throughput=10.0, stake=100.0)
        req = DilocoRoundRequest(run_id="r1", round=4, accepted=[_nid(w[0]), _nid(w[1])],
                                 rejected=[DilocoRejection(node_id=_nid(w[2]), reason="opposed: cosine -0.9")])
        for who in (keys["trainer"], w[0]):
            with ValidatorClient(orch.url, who) as c, pytest.raises(ApiError) as e:
                c.diloco_round(req)
            assert e.value.status == 403
        assert httpx.post(f"{orch.url}/v1/validator/diloco/rounds", content=req.model_dump_json()).status_code == 401
        with ValidatorClient(orch.url, keys["validator"]) as c:
            unknown = DilocoRoundRequest(run_id="r1", round=4, accepted=[_nid(w[0]), "ab" * 16])
            with pytest.raises(ApiError) as e:
                c.diloco_round(unknown)
            assert e.value.status == 422
            first = c.diloco_round(req)
            again = c.diloco_round(req)
        with NodeClient(orch.url, w[0]) as n:
            bal = [n.ledger(_nid(k)) for k in w]
        assert [o.again for o in first.outcomes] == [False] * 3 and [o.again for o in again.outcomes] == [True] * 3
        assert [o.credited for o in again.outcomes] == [1.0, 1.0, 0.0] and again.outcomes[2].slashed == 50.0
        assert [b.credits_locked for b in bal] == [1.0, 1.0, 0.0]  # the unknown node's report did nothing
        assert bal[2].status == "ejected" and bal[2].stake == 50.0
        assert sum(e.kind == "slash" for e in bal[2].entries) == 1 and "opposed" in bal[2].entries[-1].note
        assert math.isclose(bal[0].stake, 100.0)


def test_the_unguarded_baseline_averages_every_upload_and_judges_nobody(tmp_path, real_pgs):
    cfg = tiny_cfg(aggregate="mean")
    with swarm(tmp_path, cfg, n_workers=4) as s:
        assert s.http.get("/v1/diloco/run").json()["aggregate"] == "mean"
        for k in s.workers:
            assert join(s, k).status_code == 200
        sent = [real_pgs[0] * 100] + real_pgs[1:]
        for k, pg in zip(s.workers, sent):
            assert upload(s, k, pg).status_code == 202
        res = result(s, 0)
        assert res.rejected == [] and len(res.accepted) == 4
        mean = torch.stack([wire.dequantize(*wire.quantize(v, s.rounds.chunk), s.rounds.chunk) for v in sent]).mean(0)
        assert torch.allclose(res.vector(s.rounds.chunk), mean, atol=float(res.scales.max()))  # the poisoned mean
        b = ledger(s, s.workers[0], until=lambda b: b["credits_locked"] > 0)
        assert b["status"] == "active" and b["stake"] == 100.0


@pytest.mark.parametrize("attack,at_round", [("replay", 1), ("stale", 2)])
def test_a_replayed_or_stale_upload_is_caught_rounds_later(tmp_path, attack, at_round):
    """Rank 0 re-sends the previous round's published update (replay) or its own upload of 2 rounds before
    (stale), after honest rounds; the aggregator remembers both and condemns the copy."""
    rounds = list(honest_rounds(CFG, 4, at_round + 1))
    with swarm(tmp_path, CFG.model_copy(update={"workers": 4}), n_workers=4) as s:
        for k in s.workers:
            assert join(s, k).status_code == 200
        published = []
        for r in rounds[:at_round]:
            for k, pg in zip(s.workers, r.pgs):
                assert upload(s, k, pg).status_code == 202
            res = result(s, r.round)
            assert res.rejected == [] and len(res.accepted) == 4
            published.append(res.vector(s.rounds.chunk))
        last = rounds[at_round]
        copy = published[-1] if attack == "replay" else rounds[0].pgs[0]
        for k, pg in zip(s.workers, [copy] + last.pgs[1:]):
            assert upload(s, k, pg).status_code == 202
        res = result(s, at_round)
        assert [r["node_id"] for r in res.rejected] == [_nid(s.workers[0])]
        assert res.rejected[0]["reason"].startswith("replayed" if attack == "replay" else "stale")
        assert len(res.accepted) == 3
        b = ledger(s, s.workers[0], until=lambda b: b["status"] == "ejected")
        kinds = [e["kind"] for e in b["entries"]]
        # its earlier rounds' credits, still in their challenge window, are revoked with the slash
        assert b["status"] == "ejected" and kinds.count("slash") == 1 and kinds.count("revoke") == at_round
        assert b["credits_locked"] == 0 and b["stake"] == 50.0


def test_an_upload_is_sent_again_after_a_reset_connection_and_signed_afresh():
    from swarmrl.diloco.trust.client import post_retrying

    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.headers["x-sig"])
        if len(calls) < 3:
            raise httpx.ReadError("[Errno 104] Connection reset by peer", request=request)
        return httpx.Response(200, content=request.content)

    signed = iter(f"s{i}" for i in range(10))
    with httpx.Client(base_url="http://agg", transport=httpx.MockTransport(handler)) as http:
        r = post_retrying(http, "/up", b"body", lambda: {"x-sig": next(signed)}, backoff_s=0.0)
        assert r.status_code == 200 and r.content == b"body" and calls == ["s0", "s1", "s2"]
        calls.clear()
        with pytest.raises(httpx.ReadError):  # a peer that keeps resetting: the error after the last attempt
            post_retrying(http, "/up", b"body", lambda: {"x-sig": "x"}, attempts=2, backoff_s=0.0)
        assert len(calls) == 2
