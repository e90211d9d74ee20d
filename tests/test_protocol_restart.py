"""Restarting the orchestrator on the same database loses nothing: nodes, stakes, nonces,
assignments, submissions, verdicts, the ledger and the current step."""

from __future__ import annotations

import httpx
import pytest
from protocol_support import make_cfg, model_free_checks, rollouts_for, running, tokenizer, write

from swarmrl.protocol.client import ApiError, NodeClient, TrainerClient, ValidatorClient
from swarmrl.protocol.config import ValidatorConfig
from swarmrl.protocol.signing import generate_key, sign_request
from swarmrl.protocol.validator import Validator


def test_restart_loses_nothing(tmp_path):
    cfg, keys = make_cfg(tmp_path)
    honest_key, cheat_key = generate_key(), generate_key()
    with running(cfg, run_sweeper=False) as srv:
        honest, cheat = NodeClient(srv.url, honest_key), NodeClient(srv.url, cheat_key)
        honest.register(throughput=50.0, stake=300.0)
        cheat.register(throughput=50.0, stake=300.0)
        TrainerClient(srv.url, keys["trainer"]).set_step(3, 2)
        ah = honest.heartbeat().assignments[0]
        ac = cheat.heartbeat().assignments[0]
        honest.submit(ah.assignment_id, write(rollouts_for(honest.node_id, ah), tmp_path / "h.parquet"))
        cheat.submit(ac.assignment_id, write(rollouts_for(cheat.node_id, ac, correct=False, forge_rewards=True),
                                             tmp_path / "c.parquet"))
        val = Validator(vcfg := ValidatorConfig(run_secret="test-secret", work_dir=str(tmp_path / "v")),
                        client=ValidatorClient(srv.url, keys["validator"]), checks=model_free_checks(vcfg),
                        tokenizer=tokenizer())
        verdicts = dict((sid, v.accepted) for sid, v in val.run_once())
        assert sorted(verdicts.values()) == [False, True]
        body = b'{"status": {}}'
        used = {**sign_request(honest_key, "POST", "/v1/nodes/heartbeat", body), "Content-Type": "application/json"}
        assert httpx.post(srv.url + "/v1/nodes/heartbeat", content=body, headers=used).status_code == 200
        before = {n: srv.orch.ledger.balance(n).model_dump() for n in (honest.node_id, cheat.node_id)}
        pending_heartbeat = honest.heartbeat()

    with running(cfg, run_sweeper=False) as srv2:  # a new process would see the same: state is in the DB
        honest, cheat = NodeClient(srv2.url, honest_key), NodeClient(srv2.url, cheat_key)
        after = {n: srv2.orch.ledger.balance(n).model_dump() for n in (honest.node_id, cheat.node_id)}
        assert after == before
        assert srv2.orch.run.current() == (3, 2)
        # nonce used before the restart is still refused
        r = httpx.post(srv2.url + "/v1/nodes/heartbeat", content=body, headers=used)
        assert r.status_code == 401 and "replayed" in r.json()["detail"]
        # the honest node keeps its identity and its (submitted) assignment; the cheat stays ejected
        hb = honest.heartbeat()
        assert hb.step == 3 and hb.assignments == pending_heartbeat.assignments
        with pytest.raises(ApiError) as e:
            cheat.heartbeat()
        assert e.value.status == 403
        acc = TrainerClient(srv2.url, keys["trainer"]).accepted(3)
        assert [x.node_id for x in acc.items] == [honest.node_id]
        # stored files are still served by hash
        vc = ValidatorClient(srv2.url, keys["validator"])
        sha = vc.download(acc.items[0].submission_id, tmp_path / "dl.parquet")
        assert sha == acc.items[0].sha256


def test_removed_validator_key_loses_its_role(tmp_path):
    cfg, keys = make_cfg(tmp_path)
    with running(cfg, run_sweeper=False) as srv:
        ValidatorClient(srv.url, keys["validator"]).pending()
    cfg2 = cfg.model_copy(update={"validator_keys": []})
    with running(cfg2, run_sweeper=False) as srv:
        with pytest.raises(ApiError) as e:
            ValidatorClient(srv.url, keys["validator"]).pending()
        assert e.value.status == 403 and "retired" in e.value.detail
    with running(cfg, run_sweeper=False) as srv:  # listed again: restored
        assert ValidatorClient(srv.url, keys["validator"]).pending().items == []
