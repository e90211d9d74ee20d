"""A stranger joins a running swarm (issue 39): `swarmrl run` prints the join line; from an empty directory, with
no run files and no model, `swarmrl node keygen`, the operator's deposit and `swarmrl node join URL --run-key K`
are all it takes: the node reads the signed description, fetches the base model (SHARDCAST version 0) through the
relay, registers and its uploads are accepted."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from swarmrl.utils.procs import child_env, stop_process

ROOT = Path(__file__).resolve().parent.parent
JOIN = re.compile(r"swarmrl node join (\S+) --run-key ([0-9a-f]{64}).*--key (\S+) --amount ([0-9.]+)")


def _env() -> dict:
    return child_env({**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})  # they die with the test


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "swarmrl", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=_env(), check=False)


def _own_address() -> str | None:
    """This machine's first global IPv4 address (None: it has none, or no `ip` command)."""
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True,
                             timeout=10).stdout
    except OSError:
        return None
    found = re.findall(r"inet (\d+\.\d+\.\d+\.\d+)/", out)
    return found[0] if found else None


def _config(tmp: Path, model: Path, lora: bool, public: str | None) -> Path:
    f = tmp / "run.toml"
    f.write_text(f"""
mode = "swarm"
final_eval_n = 16
[warmstart]
enabled = false
[rl]
run_dir = "{tmp / 'run'}"
model = "{model}"
steps = 100000
max_minutes = 5
prompts_per_step = 4
keep_versions = 3
[rl.contract]
async_level = 1
group_size = 2
filter_ties = false
[rl.contract.task]
name = "add"
params = {{ digits = 2 }}
[rl.eval]
every_steps = 0
n = 16
[rl.workers]
num = 0
prompts_per_batch = 2
[rl.shardcast]
enabled = true
relays = 1
[rl.lora]
enabled = {str(lora).lower()}
[swarm]
nodes = 1
overassign = 2.0
assignment_timeout_s = 10.0
""" + (f'listen = "0.0.0.0"\npublic_host = "{public}"\n' if public else ""))
    return f


@pytest.mark.timeout(420)
@pytest.mark.parametrize("lora,public", [(False, False), (True, False), (False, True)],
                         ids=["full", "lora", "beyond-loopback"])
def test_a_stranger_joins_a_running_swarm_with_the_url_and_a_deposited_key(tiny_model_dir, tmp_path, lora, public):
    """Full fine-tuning and a LoRA run, whose versions are adapters the node applies to the base it fetched; and
    a run whose servers listen on every address (``swarm.listen``), joined through this machine's own address."""
    host = _own_address() if public else None
    if public and host is None:
        pytest.skip("no non-loopback address here")
    cfg = _config(tmp_path, tiny_model_dir, lora, host)
    log = (tmp_path / "run.log").open("w")
    run = subprocess.Popen([sys.executable, "-m", "swarmrl", "run", "-c", str(cfg)], cwd=tmp_path, stdout=log,
                           stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
    stranger = tmp_path / "elsewhere"
    stranger.mkdir()
    node = None
    try:
        deadline = time.monotonic() + 120
        m = None
        while m is None and time.monotonic() < deadline and run.poll() is None:
            m = JOIN.search((tmp_path / "run.log").read_text())
            time.sleep(0.5)
        assert m, (tmp_path / "run.log").read_text()[-3000:]
        url, run_key, authority, amount = m.groups()
        if host:
            assert url.startswith(f"http://{host}:")  # the join line names the public host
        # the operator's side: the stranger's key gets its stake
        key = json.loads(_cli("node", "keygen", "--out", "w/node.pem", cwd=stranger).stdout)
        dep = _cli("orchestrator", "deposit", "--orchestrator", url, "--key", authority, "--amount", amount,
                   "--public-key", key["public_key"], cwd=tmp_path)
        assert dep.returncode == 0, dep.stderr
        # the stranger: nothing but the URL, the run key and its own key
        node_log = (tmp_path / "join.log").open("w")
        node = subprocess.Popen([sys.executable, "-m", "swarmrl", "node", "join", url, "--run-key", run_key,
                                 "--work-dir", "w"], cwd=stranger, stdout=node_log, stderr=subprocess.STDOUT,
                                env=_env(), start_new_session=True)
        credited = 0.0
        deadline = time.monotonic() + 240
        while credited <= 0 and time.monotonic() < deadline and node.poll() is None:
            time.sleep(1.0)
            b = httpx.get(f"{url}/v1/nodes/{key['node_id']}/ledger", timeout=10)
            if b.status_code == 200:
                credited = b.json()["credits_locked"] + b.json()["credits_unlocked"]
        assert credited > 0, (tmp_path / "join.log").read_text()[-4000:]
        # what it fetched came through the swarm, checked against the run's hash
        events = [json.loads(ln) for ln in (stranger / "w" / "metrics").rglob("*.jsonl").__next__().open()]
        joined = [e for e in events if e.get("event") == "join"]
        assert joined and joined[0]["base_source"] == "fetched" and joined[0]["base_bytes"] > 0
        assert list((stranger / "w" / "cache" / "base").iterdir())
        assert not (stranger / "runs").exists()  # no run files here
        versions = list((stranger / "w" / "policy").glob("v*/*.safetensors"))
        if lora:  # the adapters it sampled with came through the relay, applied onto the fetched base
            assert any(p.name != "model.safetensors" for p in versions), versions
    finally:
        if node is not None:
            stop_process(node, term_s=60)
        stop_process(run, term_s=60)
