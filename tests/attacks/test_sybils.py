"""Sybils: what an outsider gets with many fresh keys and the public API. Stake is a deposit a stake authority
records, not a number a node declares; free-form registration fields are bounded; registrations and the public
reads are rate-limited per source address (429 with Retry-After); idle registrations stop holding work, one open
assignment per node, so a crowd of idle sybils cannot starve an honest node in demand mode.

The service is driven directly (injected clocks) where it can be; HTTP behaviour runs on a real uvicorn server on
127.0.0.1. The new API (deposits) is imported inside the tests that use it."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from protocol_support import make_cfg, rollouts_for, running, write
from sqlalchemy import func, select
from typer.testing import CliRunner

from swarmrl.cli import app
from swarmrl.protocol.client import ApiError, NodeClient, SignedClient
from swarmrl.protocol.node import run_node
from swarmrl.protocol.orchestrator import Orchestrator, Principal, ProtocolError
from swarmrl.protocol.schemas import HeartbeatRequest, RegisterRequest
from swarmrl.protocol.signing import generate_key, node_id_for, public_key_hex, save_private_key
from swarmrl.protocol.tables import Assignment, Node, Submission

FLOOD = Path(__file__).resolve().parents[2] / "benchmarks" / "attacks" / "flood.py"
T0 = 1_000_000.0
HB = HeartbeatRequest()


def _principal(key, role: str = "worker") -> Principal:  # noqa: ANN001
    pub = public_key_hex(key)
    return Principal(node_id_for(pub), pub, role, "0" * 64)


def _refused(fn, *args, **kw) -> ProtocolError:  # noqa: ANN001
    with pytest.raises(ProtocolError) as e:
        fn(*args, **kw)
    return e.value


def _deposit_model(tmp_path, **kw):  # noqa: ANN001, ANN202
    """The production setting: no self-declared stake (protocol_support declares it for the other tests)."""
    cfg, keys = make_cfg(tmp_path, **kw)
    return cfg.model_copy(update={"self_declared_stake": False}), keys


# ---- stake --------------------------------------------------------------------------------------------------------
def test_registration_locks_only_deposited_stake(tmp_path):
    from swarmrl.protocol.schemas import DepositRequest  # new API

    cfg, keys = _deposit_model(tmp_path)
    orch = Orchestrator(cfg)
    try:
        node = _principal(generate_key())
        e = _refused(orch.membership.register, node, RegisterRequest(throughput=10.0, stake=100.0), now=T0)
        assert e.status == 403 and "not backed by a deposit" in e.detail and "0.0 deposited" in e.detail, e.detail
        assert _refused(orch.membership.node_info, node.node_id).status == 404  # refused before anything was stored
        authority = _principal(keys["authority"], "authority")
        rep = orch.membership.deposit(authority, DepositRequest(public_key=node.public_key, amount=150.0), now=T0)
        assert rep.node_id == node.node_id and rep.deposited == 150.0
        e = _refused(orch.membership.register, node, RegisterRequest(throughput=10.0, stake=200.0), now=T0)
        assert e.status == 403 and "150.0 deposited" in e.detail  # no more than the deposit
        e = _refused(orch.membership.register, node, RegisterRequest(throughput=10.0, stake=cfg.min_stake - 1), now=T0)
        assert e.status == 422 and "below the minimum" in e.detail
        assert orch.membership.register(node, RegisterRequest(throughput=10.0, stake=150.0), now=T0).stake_locked == 150.0
        bal = orch.ledger.balance(node.node_id, now=T0)
        assert (bal.stake, bal.deposited, [r.kind for r in bal.entries]) == (150.0, 0.0, ["deposit", "stake"])
        # a deposit by node id, part of it locked
        other = _principal(generate_key())
        orch.membership.deposit(authority, DepositRequest(node_id=other.node_id, amount=130.0), now=T0)
        orch.membership.register(other, RegisterRequest(throughput=10.0, stake=100.0), now=T0)
        bal = orch.ledger.balance(other.node_id, now=T0)
        assert (bal.stake, bal.deposited) == (100.0, 30.0)
        # only an authority deposits, and not to the validator's or trainer's node
        e = _refused(orch.membership.deposit, node, DepositRequest(node_id=node.node_id, amount=1e6))
        assert e.status == 403
        e = _refused(orch.membership.deposit, authority, DepositRequest(public_key=public_key_hex(keys["validator"]), amount=1.0))
        assert e.status == 409
    finally:
        orch.db.dispose()


def test_deposits_need_a_stake_authority_key(tmp_path):
    from swarmrl.protocol.client import AuthorityClient  # new API

    cfg, keys = _deposit_model(tmp_path)
    with running(cfg, run_sweeper=False) as srv:
        node = NodeClient(srv.url, generate_key())
        body = {"public_key": node.public_key, "amount": 500.0}
        for key, status in ((node.key, 401), (keys["validator"], 403), (keys["trainer"], 403)):
            with pytest.raises(ApiError) as e:
                SignedClient(srv.url, key).request("POST", "/v1/ledger/deposits", body)
            assert e.value.status == status, (e.value.status, e.value.detail)
        with pytest.raises(ApiError) as e:  # unfunded: refused, with the reason
            node.register(throughput=10.0, stake=100.0)
        assert e.value.status == 403 and "deposit" in e.value.detail
        authority = AuthorityClient(srv.url, keys["authority"])
        rep = authority.deposit(120.0, public_key=node.public_key, note="grant")
        assert (rep.node_id, rep.deposited) == (node.node_id, 120.0)
        assert node.register(throughput=10.0, stake=120.0).stake_locked == 120.0
        bal = node.ledger()
        assert (bal.stake, bal.deposited) == (120.0, 0.0) and [r.kind for r in bal.entries] == ["deposit", "stake"]
        assert "stake authority" in bal.entries[0].note and "grant" in bal.entries[0].note
        with pytest.raises(ApiError) as e:  # a registered worker may not fund itself either
            node.request("POST", "/v1/ledger/deposits", {"node_id": node.node_id, "amount": 1e6})
        assert e.value.status == 403
        with pytest.raises(ApiError) as e:
            authority.request("POST", "/v1/ledger/deposits", {"node_id": node.node_id, "public_key": node.public_key,
                                                              "amount": 1.0})
        assert e.value.status == 422
        assert node.ledger().stake == 120.0
        # the operator's command line does the same with the authority's key file
        save_private_key(keys["authority"], tmp_path / "authority.pem")
        late = NodeClient(srv.url, generate_key())
        args = ["orchestrator", "deposit", "--orchestrator", srv.url, "--key", str(tmp_path / "authority.pem"),
                "--amount", "100"]
        assert CliRunner().invoke(app, args).exit_code == 2  # no node named
        r = CliRunner().invoke(app, [*args, "--public-key", late.public_key])
        assert r.exit_code == 0 and json.loads(r.output)["node_id"] == late.node_id, r.output
        assert late.register(throughput=10.0, stake=100.0).stake_locked == 100.0


# ---- registration bounds ------------------------------------------------------------------------------------------
def test_free_form_fields_are_bounded(tmp_path):
    cfg, _ = make_cfg(tmp_path)
    with running(cfg, run_sweeper=False) as srv:
        big = NodeClient(srv.url, generate_key())
        for hardware in ({"gpu": "x" * (64 << 10)}, {f"k{i}": i for i in range(33)}):
            with pytest.raises(ApiError) as e:
                big.request("POST", "/v1/nodes/register", {"hardware": hardware, "throughput": 10.0, "stake": 100.0})
            assert e.value.status == 422, e.value.detail
        assert httpx.get(f"{srv.url}/v1/nodes/{big.node_id}").status_code == 404  # nothing stored
        ok = NodeClient(srv.url, generate_key())
        ok.register(throughput=10.0, stake=100.0, hardware={"gpu": "none", "memory_gb": 16})
        with pytest.raises(ApiError) as e:
            ok.request("POST", "/v1/nodes/heartbeat", {"status": {"log": "x" * (64 << 10)}})
        assert e.value.status == 422
        assert ok.heartbeat({"busy": False}).node_id == ok.node_id


def test_registration_flood_from_one_address_is_rate_limited(tmp_path):
    cfg, _ = make_cfg(tmp_path)
    cfg = cfg.model_copy(update={"register_burst": 8, "register_rate_per_s": 1e-6})  # no refill during the test
    with running(cfg, run_sweeper=False) as srv:
        statuses, retry = [], []
        sybils = [NodeClient(srv.url, generate_key()) for _ in range(20)]
        for c in sybils:
            try:
                c.register(throughput=10.0, stake=100.0)
                statuses.append(200)
            except ApiError as e:
                statuses.append(e.status)
                retry.append(e.retry_after)
        assert statuses == [200] * 8 + [429] * 12
        assert all(r is not None and r >= 1 for r in retry), retry  # Retry-After: whole seconds, at least 1
        # the address limit is for joining only: members keep heartbeating, anyone keeps reading
        assert all(c.heartbeat().node_id == c.node_id for c in sybils[:8])
        assert httpx.get(f"{srv.url}/v1/health").json()["nodes_active"] == 8


def test_flood_script_reports_what_got_in(tmp_path):
    cfg, _ = _deposit_model(tmp_path)
    cfg = cfg.model_copy(update={"register_burst": 5, "register_rate_per_s": 1e-6})
    with running(cfg, run_sweeper=False) as srv:
        r = subprocess.run([sys.executable, str(FLOOD), "--orchestrator", srv.url, "--n", "12", "--heartbeat"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        # unfunded sybils are refused (403) until the address's bucket is empty, then 429
        assert (out["attempted"], out["registered"], out["refused"]) == (12, 0, {"403": 5, "429": 7}), out
        assert out["max_retry_after_s"] >= 1 and out["seconds"] > 0
        assert httpx.get(f"{srv.url}/v1/health").json()["nodes_active"] == 0


def test_flood_adversary_is_refused_and_backs_off(tmp_path):
    from swarmrl.attacks.adversaries import ADVERSARIES, Flood, flood_registrations  # new API
    from swarmrl.attacks.config import ADVERSARY_KINDS

    assert "flood" in ADVERSARY_KINDS and ADVERSARIES["flood"] is Flood
    cfg, _ = _deposit_model(tmp_path)
    cfg = cfg.model_copy(update={"register_burst": 4, "register_rate_per_s": 1e-6})
    with running(cfg, run_sweeper=False) as srv:
        out = flood_registrations(srv.url, 50)
        assert (out["attempted"], out["registered"], out["refused"]) == (5, 0, {"403": 4, "429": 1}), out
        assert out["retry_after_s"] >= 1  # a burst stops at the first 429 and waits it out


def test_public_reads_are_rate_limited_per_address(tmp_path):
    cfg, _ = make_cfg(tmp_path)
    cfg = cfg.model_copy(update={"public_burst": 6, "public_rate_per_s": 1e-6})
    with running(cfg, run_sweeper=False) as srv:
        node = NodeClient(srv.url, generate_key())
        node.register(throughput=10.0, stake=100.0)
        paths = ["/v1/health", f"/v1/nodes/{node.node_id}", f"/v1/nodes/{node.node_id}/ledger", "/v1/submissions/1"]
        first = [httpx.get(srv.url + p).status_code for p in paths + paths[:2]]
        assert first == [200, 200, 200, 404, 200, 200]  # six reads (a 404 counts too)
        for p in paths:  # then every public read from this address is refused until the bucket refills
            r = httpx.get(srv.url + p)
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, (p, r.status_code)
        # signed calls have their own (per-key) limit; joining has its own per-address bucket
        assert node.heartbeat().node_id == node.node_id
        NodeClient(srv.url, generate_key()).register(throughput=10.0, stake=100.0)


# ---- idle registrations -------------------------------------------------------------------------------------------
def _join(orch: Orchestrator, now: float) -> Principal:
    p = _principal(generate_key())
    orch.membership.register(p, RegisterRequest(throughput=10.0, stake=100.0), now=now)
    return p


def _submit(orch: Orchestrator, p: Principal, a, tmp_path: Path) -> None:  # noqa: ANN001
    path = write(rollouts_for(p.node_id, a), tmp_path / f"{p.node_id[:8]}-{a.assignment_id}.parquet")
    data = path.read_bytes()
    orch.submissions.precheck_upload(p, a.assignment_id)
    orch.submissions.accept_upload(p, a.assignment_id, path, hashlib.sha256(data).hexdigest(), len(data))


def test_idle_sybils_do_not_starve_an_honest_node(tmp_path):
    """300 sybils register and heartbeat once (two of them take all of step 0's work), then go idle. The honest
    node must get the step's work once the sybils have been silent ``idle_after_missed`` intervals, before they
    are declared dead (the old code handed it nothing until then), and complete it: two assignments, each
    counted once."""
    cfg, _ = make_cfg(tmp_path, groups_per_step=4, tasks_per_node=2, contract={"group_size": 2, "async_level": 0, "filter_ties": False, "budget": {"enabled": False}},
                      heartbeat_interval_s=10.0, dead_after_missed=3)
    orch = Orchestrator(cfg)
    try:
        sybils = [_join(orch, T0) for _ in range(300)]
        handed = sum(len(orch.assignments.heartbeat(p, HB, now=T0).assignments) for p in sybils)
        assert handed == 2  # demand mode: the step's work, one open assignment per node
        honest = _join(orch, T0)
        got, t = [], T0
        dead_at = T0 + cfg.heartbeat_interval_s * cfg.dead_after_missed
        while t < dead_at - 1:  # the honest node heartbeats every second, uploads at once what it gets
            t += 1.0
            orch.membership.sweep(now=t)
            for a in orch.assignments.heartbeat(honest, HB, now=t).assignments:
                got.append((t, a.reassigned_from))
                _submit(orch, honest, a, tmp_path)
        assert len(got) == 2 and all(r in {s.node_id for s in sybils} for _, r in got), got
        assert max(t for t, _ in got) < dead_at  # before any sybil was declared dead
        with orch.db.tx() as s:
            done = s.execute(select(Submission.node_id, func.count()).where(Submission.step == 0)
                             .group_by(Submission.node_id)).all()
            assert done == [(honest.node_id, 2)]
            held = s.execute(select(func.count()).select_from(Assignment).where(
                Assignment.status.in_(("open", "orphaned")))).scalar_one()
            assert held == 0  # nothing left hanging on the sybils
            assert s.execute(select(func.count()).select_from(Node).where(Node.status == "active")).scalar_one() \
                == 301 + 3  # the sybils are still members (until dead_after_missed), they just hold no work
    finally:
        orch.db.dispose()


def test_a_node_holds_one_open_assignment(tmp_path):
    """A sybil that keeps heartbeating but never uploads: demand mode hands it one assignment, not one more per
    heartbeat out of the orphaned work of others (the old code did, so one sybil could hoard a step)."""
    cfg, _ = make_cfg(tmp_path, groups_per_step=6, tasks_per_node=2, contract={"group_size": 2, "async_level": 0, "filter_ties": False, "budget": {"enabled": False}},
                      heartbeat_interval_s=10.0, dead_after_missed=3)
    orch = Orchestrator(cfg)
    try:
        hoarder, b, c = _join(orch, T0), _join(orch, T0), _join(orch, T0)
        [mine] = orch.assignments.heartbeat(hoarder, HB, now=T0).assignments
        assert len(orch.assignments.heartbeat(b, HB, now=T0).assignments) == len(orch.assignments.heartbeat(c, HB, now=T0).assignments) == 1
        t = T0
        for _ in range(8):  # b and c fall silent and die; their work is orphaned; the hoarder keeps beating
            t += 5.0
            orch.membership.sweep(now=t)
            held = orch.assignments.heartbeat(hoarder, HB, now=t).assignments
            assert [a.assignment_id for a in held] == [mine.assignment_id], held
        honest = _join(orch, t)
        [taken] = orch.assignments.heartbeat(honest, HB, now=t).assignments  # the orphaned work goes to a node without any
        assert taken.reassigned_from in (b.node_id, c.node_id)
    finally:
        orch.db.dispose()


def test_a_working_node_keeps_heartbeating(tmp_path):
    """While it works on an assignment (which may take longer than the idle window), ``run_node`` goes on
    heartbeating, so an honest node's work is never taken for an idle sybil's."""
    cfg, _ = make_cfg(tmp_path, heartbeat_interval_s=0.05)
    with running(cfg, run_sweeper=False) as srv:
        c = NodeClient(srv.url, generate_key())
        c.register(throughput=10.0, stake=100.0)
        beat_while_working = threading.Event()

        def handler(a, reply):  # noqa: ANN001, ANN202
            start = srv.orch.telemetry.counters["heartbeats"]
            deadline = time.monotonic() + 20.0
            while time.monotonic() < deadline and not beat_while_working.is_set():
                if srv.orch.telemetry.counters["heartbeats"] >= start + 3:
                    beat_while_working.set()
                time.sleep(0.01)
            return None

        run_node(c, handler, max_beats=1)
        assert beat_while_working.is_set()


def test_a_node_started_before_its_deposit_registers_once_it_lands(tmp_path):
    """The refusal of undeposited stake says Retry-After (the deposit may be on its way: a node started beside its
    stake authority); ensure_registered waits for it, up to deposit_wait_s, and then gives up with the 403."""
    import threading

    from protocol_support import running

    from swarmrl.protocol.client import ApiError, AuthorityClient, NodeClient
    from swarmrl.protocol.node import ensure_registered
    from swarmrl.protocol.signing import generate_key

    cfg, keys = _deposit_model(tmp_path)
    with running(cfg, run_sweeper=False) as srv:
        node = NodeClient(srv.url, generate_key())
        with pytest.raises(ApiError) as e:
            node.register(throughput=10.0, stake=150.0)
        assert e.value.status == 403 and e.value.retry_after is not None
        done = []
        th = threading.Thread(target=lambda: done.append(ensure_registered(node, 10.0, 150.0, deposit_wait_s=60.0)))
        th.start()
        with AuthorityClient(srv.url, keys["authority"]) as auth:
            auth.deposit(150.0, node_id=node.node_id, note="late")
        th.join(timeout=60)
        assert done == [None] and node.ledger().stake == 150.0
        loner = NodeClient(srv.url, generate_key())  # nobody deposits for it: refused after the wait
        with pytest.raises(ApiError) as e:
            ensure_registered(loner, 10.0, 150.0, deposit_wait_s=0.0)
        assert e.value.status == 403
