"""A multi-turn tool task through the whole swarm (`swarmrl run --swarm`, real processes on 127.0.0.1), with the
task brought by a plugin package (entry-point group ``swarmrl.envs``) every role loads: honest nodes' trajectories
(model turns and the environment's replies, masked) pass the proofs and the validator's replay; nodes that edit an
environment turn, forge the tool's result or claim rewards the replay does not give are rejected and ejected."""

from __future__ import annotations

import pytest
from swarm_support import (  # noqa: F401
    CAUGHT_BY,
    MULTITURN_CAUGHT_BY,
    _cfg,
    _check_report,
    _kill_leftovers,
    _run_in_thread,
    install_echo_plugin,
)

from swarmrl.envs import available_envs, make_env
from swarmrl.envs.config import TaskConfig
from swarmrl.inference.params import SamplingParams
from swarmrl.rollouts.wire import read_rollouts
from swarmrl.utils.metrics import read_metrics


def test_a_plugin_package_brings_a_task(tmp_path, monkeypatch):
    path = install_echo_plugin(tmp_path / "site")
    for p in reversed(path.split(":")):
        monkeypatch.syspath_prepend(p)
    assert {"echo_tool", "echo_broken", "echo_missing"} <= set(available_envs())
    env = make_env("echo_tool", max_turns=2)
    assert env.max_turns == 2 and env.stop == tuple("0123456789")
    with pytest.raises(TypeError, match="not an Environment"):
        make_env("echo_broken")
    with pytest.raises(ImportError, match="echo_missing.*does not load"):
        make_env("echo_missing")
    with pytest.raises(KeyError, match="unknown task"):
        make_env("echo_nothing")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_swarm_multiturn_tool_task_replays_honest_work_and_catches_the_cheats(tiny_model_dir, tmp_path, monkeypatch):
    path = install_echo_plugin(tmp_path / "site")
    monkeypatch.setenv("PYTHONPATH", path)  # every role's process loads the plugin
    for p in reversed(path.split(":")):
        monkeypatch.syspath_prepend(p)
    adversaries = ["edit_env_turn", "forge_tool_result", "forge_rewards"]
    cfg = _cfg(tmp_path, tiny_model_dir, adversaries, steps=6, task=TaskConfig(name="echo_tool", params={"max_turns": 4}),
               contract_extra={"sampling": SamplingParams(max_trajectory_tokens=24, temperature=1.0)})
    t, out = _run_in_thread(cfg)
    t.join(timeout=540)
    assert not t.is_alive(), "run did not finish"
    assert "error" not in out, out.get("error")
    s = out["summary"]
    assert s["steps"] == 6
    _check_report(s, adversaries, {**CAUGHT_BY, **MULTITURN_CAUGHT_BY})
    run_dir = tmp_path / "run"
    honest = {n["node_id"] for n in s["swarm"]["nodes"].values() if n["adversary"] is None}
    used = [f for r in read_metrics(run_dir / "metrics" / "trainer.jsonl") if "files" in r for f in r["files"]]
    assert used
    rows = [r for f in run_dir.rglob("*.parquet") for r in read_rollouts(f) if r.worker_id in honest]
    multi = [r for r in rows if r.completion_mask is not None and 0 in r.completion_mask]
    assert multi and all(r.proofs for r in multi)  # real tool turns, masked, with proofs over the model's tokens
