"""Helpers of the end-to-end swarm tests: a small RunConfig, running ``launch`` in a thread, waiting, and
the checks of a run's per-node report."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from swarmrl.contract import RLContract
from swarmrl.envs.config import TaskConfig
from swarmrl.job import RunConfig, SwarmSection, WarmstartSection
from swarmrl.job.launch import launch
from swarmrl.rl.config import EvalSection, RLConfig, WorkerSection
from swarmrl.utils.metrics import read_metrics

# what each adversary must be caught by: a verdict reason prefix, or the HTTP status its uploads get
CAUGHT_BY = {
    "forge_rewards": "rewards:",
    "own_tasks": "tasks:",
    "replay": "schema:",
    "stale_policy": "policy:",
    "other_temperature": "schema:",  # sampled at its own temperature, not the contract's
    "random_model": "logprobs:",
    "edit_tokens": "logprobs:",
    "malformed": 422,
    "oversized": 413,
    "wrong_key": 401,
    "bomb": 413,
    # honest work, and an attack the protocol stops without a verdict (see job.report._caught)
    "flood": "stopped",
    # honest work, and an attack on the servers: it must fail, i.e. the honest nodes' heartbeats and uploads keep
    # their latency during it (job.report.honest_latency: median within 2x + 50 ms of outside it, none unserved)
    "idle_connections": "held",
}


# the multi-turn cheats: the validator's replay of the environment's turns
MULTITURN_CAUGHT_BY = {"edit_env_turn": "replay:", "forge_tool_result": "replay:"}
PLUGIN_DIR = Path(__file__).resolve().parent / "plugin_env"


def install_echo_plugin(site: Path) -> str:
    """A dist-info in ``site`` whose entry points (group ``swarmrl.envs``) name tests/plugin_env's tasks; the
    PYTHONPATH that installs it (and the plugin's module) for this process's children."""
    d = site / "swarmrl_echo_env-0.1.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: swarmrl-echo-env\nVersion: 0.1\n")
    (d / "entry_points.txt").write_text("[swarmrl.envs]\necho_tool = swarmrl_echo_env:make\n"
                                        "echo_broken = swarmrl_echo_env:broken\necho_missing = swarmrl_echo_env:nope\n")
    return os.pathsep.join([str(site), str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)


def _cfg(tmp_path, model, adversaries, *, nodes=2, steps=6, prompts=4, tasks=2, rl_extra=None, contract_extra=None,
         task=None, **swarm) -> RunConfig:
    task = task or TaskConfig(name="add", params={"digits": 2})
    contract = RLContract(task=task, async_level=1, group_size=2,
                          filter_ties=False, **(contract_extra or {}))
    rl = RLConfig(run_dir=str(tmp_path / "run"), model=str(model), contract=contract,
                  steps=steps, keep_versions=3, prompts_per_step=prompts,
                  eval=EvalSection(every_steps=0, n=16),
                  workers=WorkerSection(num=0, prompts_per_batch=tasks), **(rl_extra or {}))
    sw = dict(nodes=nodes, adversaries=adversaries, overassign=2.0, assignment_timeout_s=10.0)
    sw.update(swarm)
    return RunConfig(mode="swarm", rl=rl, warmstart=WarmstartSection(enabled=False), final_eval_n=16,
                     swarm=SwarmSection(**sw))


def _check_report(summary: dict, adversaries: list[str], expect: dict = CAUGHT_BY) -> None:
    nodes = summary["swarm"]["nodes"]
    for name, n in nodes.items():
        if n["adversary"] is None:
            assert n["rejected"] == 0 and n["slashed"] == 0 and n["status"] in ("active", "dead"), (name, n)
            assert n["refused_uploads"] == 0, (name, n)
            continue
        want = expect[n["adversary"]]
        if want == "stopped":
            assert n["caught"] and n["rejected"] == 0, (name, n)
            continue
        if want == "held":  # from hundreds of addresses, connections really held, honest latency kept
            assert n["idle_addresses"] >= 100 and n["idle_peak_open"] > 0, (name, n)
            assert n["held"] and n["caught"] and n["rejected"] == 0, (name, n["honest_latency"], n)
            continue
        assert n["caught"], (name, n)
        if isinstance(want, int):
            assert n["refused_uploads"] >= 1 and n["accepted"] == 0, (name, n)
            assert all(r.startswith(f"{want}:") for r in n["refusals"]), (name, n)
        else:
            assert n["rejected"] >= 1 and n["status"] == "ejected" and n["slashed"] > 0, (name, n)
            assert all(r.startswith(want) for r in n["reject_reasons"]), (name, n)
    assert sorted(n["adversary"] for n in nodes.values() if n["adversary"]) == sorted(adversaries)


def _run_in_thread(cfg):
    out: dict = {}

    def go():
        try:
            out["summary"] = launch(cfg, progress=lambda m: None)
        except BaseException as e:  # noqa: BLE001
            out["error"] = e

    t = threading.Thread(target=go, daemon=True)
    t.start()
    _started.append((cfg.rl.run_dir, t))
    return t, out


_started: list[tuple[str, threading.Thread]] = []


@pytest.fixture(autouse=True)
def _kill_leftovers():
    """A failed run must not leave its processes behind (they run in their own sessions)."""
    yield
    while _started:
        run_dir, t = _started.pop()
        pids = Path(run_dir) / "pids.json"
        if t.is_alive() and pids.is_file():  # only a launcher still running owns these pids
            (Path(pids).parent / "DONE").touch()
            for pid in json.loads(pids.read_text()).values():
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def _wait(cond, timeout, what):
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _trainer_steps(run_dir) -> int:
    return len([r for r in read_metrics(run_dir / "metrics" / "trainer.jsonl") if "reward" in r])
