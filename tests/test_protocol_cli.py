"""The CLI: key generation in-process; the full set of real processes (orchestrator, node, validator)
as a slow scenario, including an orchestrator restart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from protocol_support import database_url, rollouts_for, write
from typer.testing import CliRunner

from swarmrl.cli import app
from swarmrl.protocol.client import NodeClient, wait_until_up
from swarmrl.protocol.signing import load_private_key, public_key_hex
from swarmrl.utils.procs import free_port

ROOT = Path(__file__).resolve().parents[1]


def test_keygen_and_pubkey(tmp_path):
    r = CliRunner().invoke(app, ["node", "keygen", "--out", str(tmp_path / "n.pem")])
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["public_key"] == public_key_hex(load_private_key(tmp_path / "n.pem"))
    r2 = CliRunner().invoke(app, ["node", "pubkey", "--key", str(tmp_path / "n.pem")])
    assert json.loads(r2.output)["node_id"] == info["node_id"]
    r3 = CliRunner().invoke(app, ["node", "keygen", "--out", str(tmp_path / "n.pem")])
    assert r3.exit_code == 2  # never overwrites a key


def test_config_errors_name_the_field():
    r = CliRunner().invoke(app, ["orchestrator", "serve", "--set", "slash_fraction=2", "--print-config"])
    assert r.exit_code == 2 and "slash_fraction" in r.output
    r = CliRunner().invoke(app, ["orchestrator", "serve", "--set", "validator_keys=['nothex']", "--print-config"])
    assert r.exit_code == 2 and "validator_keys" in r.output


def _cli(*args: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "swarmrl", *args], capture_output=True, text=True, env=env,
                          timeout=300, **kw)


def _start_orchestrator(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "swarmrl", "orchestrator", "serve", *args],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT, env=env)


@pytest.mark.slow
def test_real_processes_end_to_end(tmp_path):
    keys = {}
    for name in ("validator", "node", "authority"):
        r = _cli("node", "keygen", "--out", str(tmp_path / f"{name}.pem"))
        assert r.returncode == 0, r.stderr
        keys[name] = json.loads(r.stdout)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["--port", str(port), "--data-dir", str(tmp_path / "orch"),
            "--set", f"validator_keys=['{keys['validator']['public_key']}']", "--set", "run_secret='s3'",
            "--set", f"stake_authority_keys=['{keys['authority']['public_key']}']",
            "--set", "tasks_per_node=2", "--set", "contract.group_size=2"]
    dburl = database_url(tmp_path)
    if dburl:
        args += ["--database-url", dburl]
    log = tmp_path / "orch.log"
    proc = _start_orchestrator(args, log)
    try:
        wait_until_up(url, proc, timeout=180)
        spec = httpx.get(url + "/openapi.json").json()
        assert "/v1/nodes/heartbeat" in spec["paths"] and "HeartbeatReply" in spec["components"]["schemas"]
        r = _cli("orchestrator", "deposit", "--orchestrator", url, "--key", str(tmp_path / "authority.pem"),
                 "--public-key", keys["node"]["public_key"], "--amount", "100")  # the node's stake (NodeConfig.stake)
        assert r.returncode == 0, r.stderr
        r = _cli("node", "run", "--orchestrator", url, "--key", str(tmp_path / "node.pem"), "--max-beats", "2")
        assert r.returncode == 0, r.stderr
        beats = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        assert len(beats) == 2 and beats[0]["assignments"]
        node = NodeClient(url, tmp_path / "node.pem")
        a = node.heartbeat().assignments[0]
        sid = node.submit(a.assignment_id, write(rollouts_for(node.node_id, a), tmp_path / "r.parquet")).submission_id
        # no model here: the validator starts only when told to run the cheap checks alone
        r = _cli("validator", "run", "--orchestrator", url, "--key", str(tmp_path / "validator.pem"),
                 "--set", "run_secret='s3'", "--set", "max_batches=1", "--set", f"work_dir='{tmp_path / 'val'}'",
                 "--set", "cheap_checks_only=true")
        assert r.returncode == 0, r.stderr
        summary = json.loads(r.stdout.strip().splitlines()[-1])  # the validator's health at exit
        assert summary["judged"] == 1 and summary["validator_internal_errors"] == 0 and not summary["left_pending"]
        before = node.ledger()
        # without a model_dir the validator cannot decode: rewards are skipped, the rest is checked, and it says so
        assert before.credits_locked == 4.0
        assert "model checks not run" in node.submission(sid).reason
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    proc = _start_orchestrator(args, log)
    try:
        wait_until_up(url, proc, timeout=180)
        assert NodeClient(url, tmp_path / "node.pem").ledger() == before
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
