"""Joining from anywhere over emulated links (issue 39): `swarmrl run` under the 20 Mbit/s 150 ms lossy profile with
one namespace left for a guest; from that namespace, in an empty directory with no run files and no model, a
stranger deposits nothing itself (the run's stake authority does, from the printed deposit line) and runs `swarmrl
node join URL --run-key KEY`: it fetches the base model through the relay over its lossy link and its uploads are
accepted. Beside it a node of the run samples at a temperature of its own and is rejected for that reason, and a
node that serves another base model is refused at registration for that reason."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from swarm_support import _cfg, _kill_leftovers, _started  # noqa: F401

from swarmrl.job.config import WanSection
from swarmrl.job.launch import launch
from swarmrl.utils.procs import child_env
from swarmrl.wan import netns

ROOT = Path(__file__).resolve().parent.parent
_NO_RIGHTS = netns.rights_problem()


def _in_ns(ns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", ns, sys.executable, "-m", "swarmrl", *args]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(bool(_NO_RIGHTS), reason=_NO_RIGHTS or "ok")
def test_a_stranger_joins_over_a_lossy_link_and_a_hot_sampler_is_rejected(tiny_model_dir, tmp_path):
    from swarmrl.rl.config import ShardcastSection

    cfg = _cfg(tmp_path, tiny_model_dir, ["other_temperature"], nodes=1, steps=100000,
               rl_extra={"shardcast": ShardcastSection(enabled=True, relays=1), "max_minutes": 10})
    cfg = cfg.model_copy(update={"wan": WanSection(profile="wan20lossy", guests=1, seed=3)})
    run_dir = tmp_path / "run"
    said: list[str] = []
    out: dict = {}

    def go() -> None:
        try:
            out["summary"] = launch(cfg, progress=said.append)
        except BaseException as e:  # noqa: BLE001
            out["error"] = e

    t = threading.Thread(target=go, daemon=True)
    t.start()
    _started.append((cfg.rl.run_dir, t))
    env = child_env({**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})  # they die with the test
    stranger = tmp_path / "elsewhere"
    stranger.mkdir()
    node = None
    try:
        deadline, m = time.monotonic() + 240, None
        while m is None:
            assert time.monotonic() < deadline and t.is_alive(), (said, out.get("error"))
            m = next((re.search(r"swarmrl node join (\S+) --run-key ([0-9a-f]{64}).*--key (\S+) --amount ([0-9.]+)",
                                s) for s in said if "swarmrl node join" in s), None)
            time.sleep(0.5)
        url, run_key, authority, amount = m.groups()
        ns = json.loads((run_dir / "wan.json").read_text())["roles"]["guest0"]["netns"]
        key = json.loads(subprocess.run(_in_ns(ns, "node", "keygen", "--out", "w/node.pem"),
                                        cwd=stranger, env=env, capture_output=True, text=True, check=True).stdout)
        dep = subprocess.run(_in_ns(ns, "orchestrator", "deposit", "--orchestrator", url, "--key", authority,
                                    "--amount", amount, "--public-key", key["public_key"]),
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert dep.returncode == 0, dep.stderr
        log = (tmp_path / "join.log").open("w")
        node = subprocess.Popen(_in_ns(ns, "node", "join", url, "--run-key", run_key, "--work-dir", "w"),
                            cwd=stranger, env=env, stdout=log, stderr=subprocess.STDOUT)
        credited, deadline = 0.0, time.monotonic() + 420
        while credited <= 0:
            assert time.monotonic() < deadline and node.poll() is None, (tmp_path / "join.log").read_text()[-4000:]
            time.sleep(2.0)
            with netns.inside(ns):
                r = httpx.get(f"{url}/v1/nodes/{key['node_id']}/ledger", timeout=20)
            if r.status_code == 200:
                credited = r.json()["credits_locked"] + r.json()["credits_unlocked"]
        metrics = next((stranger / "w" / "metrics").rglob("*.jsonl"))
        joined = [e for e in map(json.loads, metrics.read_text().splitlines()) if e.get("event") == "join"]
        assert joined[0]["base_source"] == "fetched" and joined[0]["base_bytes"] > 0, joined
        assert not (stranger / "runs").exists() and not list((stranger / "w" / "cache" / "base").glob("*.tar"))
        # a node from the same guest namespace that serves another base model (the run's own config, another
        # model): refused at registration with that reason, exit status 3
        other_model = tmp_path / "other_model"
        subprocess.run([sys.executable, "-m", "swarmrl", "model", "init", "--out", str(other_model),
                        "--set", "seed=7"], env=env, capture_output=True, check=True, timeout=120)
        rl = (run_dir / "rl.toml").read_text().replace(f'model = "{tiny_model_dir}"', f'model = "{other_model}"')
        assert str(other_model) in rl
        (tmp_path / "other_rl.toml").write_text(rl)
        other = json.loads(subprocess.run(_in_ns(ns, "node", "keygen", "--out", "o/node.pem"), cwd=stranger, env=env,
                                          capture_output=True, text=True, check=True).stdout)
        subprocess.run(_in_ns(ns, "orchestrator", "deposit", "--orchestrator", url, "--key", authority, "--amount",
                              amount, "--public-key", other["public_key"]), cwd=tmp_path, env=env, check=True,
                       capture_output=True, timeout=120)
        r = subprocess.run(_in_ns(ns, "node", "run", "--orchestrator", url, "--key", "o/node.pem", "--rl-config",
                                  str(tmp_path / "other_rl.toml"), "--set", f'work_dir="{stranger / "o"}"'),
                           cwd=stranger, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 3 and "serves base model" in r.stdout + r.stderr, (r.returncode, r.stderr[-2000:])
    finally:
        if node is not None and node.poll() is None:
            node.terminate()
            node.wait(timeout=60)
        (run_dir / "DONE").touch()  # the trainer ends its run at its next step
        t.join(timeout=300)
    assert not t.is_alive() and "error" not in out, out.get("error")
    nodes = out["summary"]["swarm"]["nodes"]
    hot = [n for n in nodes.values() if n["adversary"] == "other_temperature"]
    assert hot and hot[0]["rejected"] >= 1 and all("temperature" in r for r in hot[0]["reject_reasons"]), hot
    assert all(n["rejected"] == 0 for n in nodes.values() if n["adversary"] is None), nodes
