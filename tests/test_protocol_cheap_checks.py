"""A validator without a model cannot re-check rewards, environment replays, logprobs, TOPLOC proofs or sampling; it must not pass such
work off as checked. It refuses to start (the shipped configs/validator.toml included) unless
``cheap_checks_only = true`` says so explicitly, and then every verdict it writes says the model checks were not
run."""

from __future__ import annotations

from pathlib import Path

import pytest
from protocol_support import make_cfg, rollouts_for, running, write
from typer.testing import CliRunner

from swarmrl.cli import app
from swarmrl.config import load_config
from swarmrl.protocol.client import NodeClient, ValidatorClient
from swarmrl.protocol.config import ValidatorConfig
from swarmrl.protocol.signing import generate_key, save_private_key
from swarmrl.protocol.validator import Validator, config_problems

REPO = Path(__file__).resolve().parents[1]
NOT_RUN = "model checks not run"


def test_the_shipped_validator_config_refuses_to_start_without_a_model(tmp_path):
    save_private_key(generate_key(), tmp_path / "v.pem")
    argv = ["validator", "run", "-c", str(REPO / "configs/validator.toml"), "--key", str(tmp_path / "v.pem"),
            "--set", "max_batches=1", "--set", "poll_interval_s=0.01", "--set", f'work_dir="{tmp_path / "val"}"']
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 2, r.output  # before any poll: a usage error naming both ways out
    assert "model_dir" in r.stderr and "cheap_checks_only = true" in r.stderr
    # said explicitly, it starts (one poll of an orchestrator that is not there, then the summary)
    r = CliRunner().invoke(app, [*argv, "--set", "cheap_checks_only=true"])
    assert r.exit_code == 0, r.output


def test_config_problems_name_the_missing_model_and_a_contradiction(tmp_path):
    cfg = load_config(ValidatorConfig, REPO / "configs/validator.toml")
    assert any("no model_dir" in p for p in config_problems(cfg))
    assert not any("model_dir" in p for p in config_problems(cfg.model_copy(update={"cheap_checks_only": True})))
    model = tmp_path / "model"
    model.mkdir()
    both = cfg.model_copy(update={"cheap_checks_only": True, "model_dir": str(model)})
    assert any("cheap_checks_only" in p for p in config_problems(both))


@pytest.fixture()
def env(tmp_path):
    cfg, keys = make_cfg(tmp_path, slash_fraction=0.25, contract={"async_level": 1})
    with running(cfg, run_sweeper=False) as srv:
        yield srv, keys, tmp_path


def _node(srv) -> NodeClient:
    n = NodeClient(srv.url, generate_key())
    n.register(throughput=10.0, stake=200.0)
    return n


def test_every_verdict_of_a_cheap_checks_only_validator_says_the_model_checks_were_not_run(env):
    srv, keys, tmp = env
    vcfg = ValidatorConfig(run_secret="test-secret", work_dir=str(tmp / "val"), cheap_checks_only=True)
    val = Validator(vcfg, client=ValidatorClient(srv.url, keys["validator"]))
    # forged rewards pass: nothing here can decode the completions. The verdict must not claim otherwise
    node = _node(srv)
    a = node.heartbeat().assignments[0]
    node.submit(a.assignment_id, write(rollouts_for(node.node_id, a, correct=False, forge_rewards=True),
                                       tmp / "forged.parquet"))
    [(sid, v)] = val.run_once()
    assert v.accepted and NOT_RUN in v.reason and "all checks passed" not in v.reason
    detail = node.submission(sid)  # what the orchestrator keeps and shows
    assert NOT_RUN in detail.reason
    skipped = {c.name: c.reason for c in detail.checks if c.skipped}
    assert set(skipped) == {"replay", "logprobs", "toploc", "sampling", "rewards"}
    assert all(NOT_RUN in why for why in skipped.values()), skipped
    assert all(c.ok and not c.skipped for c in detail.checks if c.name in ("schema", "seed", "tasks", "policy"))
    # a rejection by a cheap check says it too
    other = _node(srv)
    a2 = other.heartbeat().assignments[0]
    easy = [(f"mul_add:0*0+{i}", f"0*0+{i}=", i) for i in range(len(a2.tasks))]
    other.submit(a2.assignment_id, write(rollouts_for(other.node_id, a2, tasks=easy), tmp / "easy.parquet"))
    [(sid2, v2)] = val.run_once()
    assert not v2.accepted and v2.reason.startswith("tasks:") and NOT_RUN in v2.reason
    assert NOT_RUN in other.submission(sid2).reason
