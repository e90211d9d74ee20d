"""The run secret. The shipped default (``change-me``) is public: with it anyone derives every task seed, so an
orchestrator reachable from outside, or a validator judging one, refuses to start with it (the error names
the field). ``swarmrl run`` makes a fresh secret per run. And a validator whose secret differs from the
orchestrator's does not slash honest nodes for it: the seed is the orchestrator's, never the node's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from protocol_support import make_cfg, model_free_checks, rollouts_for, running, tokenizer, write
from pydantic import ValidationError
from typer.testing import CliRunner

import swarmrl
from swarmrl.cli import app
from swarmrl.config import ConfigError, load_config
from swarmrl.protocol.client import NodeClient, ValidatorClient
from swarmrl.protocol.config import OrchestratorConfig, ValidatorConfig
from swarmrl.protocol.signing import generate_key
from swarmrl.protocol.validator import Validator

CONFIGS = Path(swarmrl.__file__).resolve().parents[1] / "configs"
OUTSIDE = ["0.0.0.0", "::", "10.1.2.3", "orchestrator.example.com", ""]


@pytest.mark.parametrize("host", OUTSIDE)
def test_orchestrator_refuses_the_default_secret_off_loopback(host):
    with pytest.raises(ValidationError) as e:
        OrchestratorConfig(host=host)
    assert e.value.errors()[0]["loc"] == ("run_secret",) and "change-me" in str(e.value)
    with pytest.raises(ValidationError, match="run_secret"):
        OrchestratorConfig(host=host, run_secret="")
    assert OrchestratorConfig(host=host, run_secret="f00d" * 8).host == host  # a secret of one's own: fine


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_keeps_the_default_for_local_runs(host):
    assert OrchestratorConfig(host=host).run_secret == "change-me"


def test_shipped_orchestrator_config_off_loopback_is_a_config_error_naming_the_field():
    with pytest.raises(ConfigError) as e:
        load_config(OrchestratorConfig, CONFIGS / "orchestrator.toml", ['host="0.0.0.0"'])
    assert "run_secret" in str(e.value) and "0.0.0.0" in str(e.value)
    r = CliRunner().invoke(app, ["orchestrator", "serve", "-c", str(CONFIGS / "orchestrator.toml"),
                                 "--set", 'host="0.0.0.0"', "--print-config"])
    assert r.exit_code == 2 and "run_secret" in r.output, r.output


def test_orchestrator_serve_does_not_start(tmp_path):
    """The real command, not only its config: it exits (status 2, the field named) instead of listening."""
    try:
        r = subprocess.run([sys.executable, "-m", "swarmrl", "orchestrator", "serve", "-c",
                            str(CONFIGS / "orchestrator.toml"), "--set", 'host="0.0.0.0"', "--set", "port=0",
                            "--set", f"data_dir={json.dumps(str(tmp_path / 'orch'))}"],
                           capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the orchestrator started listening on 0.0.0.0 with the public default secret")
    assert r.returncode == 2 and "run_secret" in r.stderr, (r.returncode, r.stderr[-2000:])


@pytest.mark.parametrize("url", ["http://10.1.2.3:8700", "https://orch.example.com", "http://0.0.0.0:8700"])
def test_validator_refuses_the_default_secret_for_a_remote_orchestrator(url):
    with pytest.raises(ValidationError) as e:
        ValidatorConfig(orchestrator=url)
    assert e.value.errors()[0]["loc"] == ("run_secret",)
    assert ValidatorConfig(orchestrator=url, run_secret="f00d" * 8).orchestrator == url
    assert ValidatorConfig(orchestrator="http://127.0.0.1:8700").run_secret == "change-me"
    r = CliRunner().invoke(app, ["validator", "run", "-c", str(CONFIGS / "validator.toml"), "--orchestrator", url,
                                 "--print-config"])
    assert r.exit_code == 2 and "run_secret" in r.output, r.output


def test_swarmrl_run_makes_a_fresh_secret(tmp_path):
    from swarmrl.job.config import RunConfig
    from swarmrl.job.launch import _plan

    plans = []
    for i in range(2):
        (tmp_path / f"r{i}").mkdir()
        plans.append(_plan(RunConfig(mode="swarm"), tmp_path / f"r{i}"))
    for p in plans:
        assert p.orchestrator.run_secret not in ("", "change-me") and len(p.orchestrator.run_secret) >= 32
        assert p.validator.run_secret == p.orchestrator.run_secret
        assert p.orchestrator.host == "127.0.0.1"
    assert plans[0].orchestrator.run_secret != plans[1].orchestrator.run_secret


def test_a_validator_with_another_secret_does_not_slash(tmp_path):
    """Seeds are made by the orchestrator; a validator that derives others has the wrong secret (its problem):
    an internal error, nothing posted, the honest node keeps its stake."""
    cfg, keys = make_cfg(tmp_path)
    with running(cfg, run_sweeper=False) as srv:
        vcfg = ValidatorConfig(run_secret="not-the-orchestrators", work_dir=str(tmp_path / "val"))
        val = Validator(vcfg, client=ValidatorClient(srv.url, keys["validator"]), checks=model_free_checks(vcfg),
                        tokenizer=tokenizer())
        node = NodeClient(srv.url, generate_key())
        node.register(throughput=10.0, stake=200.0)
        a = node.heartbeat().assignments[0]
        sid = node.submit(a.assignment_id, write(rollouts_for(node.node_id, a), tmp_path / "h.parquet")).submission_id
        assert val.run_once() == []
        assert node.submission(sid).status == "pending" and node.ledger().stake == 200.0
        assert val.internal_errors == 1
        assert val.health()["validator_internal_errors"] == 1
