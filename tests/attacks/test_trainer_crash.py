"""Finding 8: every role, the trainer included, is supervised and resumes from its last checkpoint.

On 86de17d a ``kill -9`` of the trainer ended the run (the launcher only watched it) and
``swarmrl run --set fresh=false`` did not resume a swarm run (new keys and a new run secret, so the
validator could no longer re-derive the seeds of work assigned before)."""

from __future__ import annotations

import json
import os
import signal

import pytest
from swarm_support import _cfg, _kill_leftovers, _run_in_thread, _trainer_steps, _wait  # noqa: F401

from swarmrl.rl.config import ShardcastSection
from swarmrl.rundir.writer import RunDir
from swarmrl.utils.metrics import read_metrics


def _pids(run_dir) -> dict:
    return json.loads((run_dir / "pids.json").read_text())


def _kill_and_wait_restart(run_dir, role: str, t, timeout: float = 240) -> None:
    pid = _pids(run_dir)[role]
    os.killpg(pid, signal.SIGKILL)
    _wait(lambda: _pids(run_dir).get(role) != pid or not t.is_alive(), timeout, f"{role} restarted")


def _assert_each_step_trained_once(run_dir, steps: int) -> None:
    rows = [r for r in read_metrics(run_dir / "metrics" / "trainer.jsonl") if "reward" in r]
    assert sorted(r["step"] for r in rows) == list(range(steps))  # nothing lost, nothing trained twice
    files = [f for r in rows for f in r["files"]]
    assert len(files) == len(set(files))
    assert RunDir(run_dir).latest_version() == steps


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_role_killed_once_and_the_run_finishes(tiny_model_dir, tmp_path):
    steps = 24  # enough that the run outlasts the five kills and restarts (10 steps can end within them)
    cfg = _cfg(tmp_path, tiny_model_dir, [], nodes=3, steps=steps, prompts=4, tasks=2,
               rl_extra={"shardcast": ShardcastSection(enabled=True, relays=1)})
    run_dir = tmp_path / "run"
    t, out = _run_in_thread(cfg)
    _wait(lambda: _trainer_steps(run_dir) >= 2 or not t.is_alive(), 300, "two trainer steps")
    for role in ("trainer", "orchestrator", "validator", "adapter", "relay0"):
        assert t.is_alive(), out.get("error")
        _kill_and_wait_restart(run_dir, role, t)
        done = _trainer_steps(run_dir)
        _wait(lambda d=done: _trainer_steps(run_dir) > d or not t.is_alive(), 300, f"a step after {role}")
    assert t.is_alive(), "the run ended before a node could leave"
    os.killpg(_pids(run_dir)["n2"], signal.SIGKILL)  # a node that leaves is not restarted: its work is reassigned
    t.join(timeout=600)
    assert not t.is_alive() and "error" not in out, out.get("error")
    s = out["summary"]
    assert s["steps"] == steps
    _assert_each_step_trained_once(run_dir, steps)
    honest = s["swarm"]["nodes"]
    assert all(n["rejected"] == 0 and n["slashed"] == 0 for n in honest.values()), honest


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["local", "swarm"])
def test_fresh_false_resumes_a_run(tiny_model_dir, tmp_path, mode):
    """A finished (or interrupted) run continues with ``fresh = false``: same keys and run secret, training
    resumes from the newest checkpoint, and no step is trained twice."""
    cfg = _cfg(tmp_path, tiny_model_dir, [], nodes=2, steps=3, prompts=4, tasks=2)
    if mode == "local":
        cfg = cfg.model_copy(update={"mode": "local", "rl": cfg.rl.model_copy(
            update={"workers": cfg.rl.workers.model_copy(update={"num": 2})})})
    run_dir = tmp_path / "run"
    t, out = _run_in_thread(cfg)
    t.join(timeout=400)
    assert "error" not in out, out.get("error")
    secret = (run_dir / "run_secret").read_text() if mode == "swarm" else None
    more = cfg.model_copy(update={"fresh": False, "rl": cfg.rl.model_copy(update={"steps": 6})})
    t, out = _run_in_thread(more)
    t.join(timeout=400)
    assert "error" not in out, out.get("error")
    assert out["summary"]["steps"] == 6
    _assert_each_step_trained_once(run_dir, 6)
    if mode == "swarm":
        assert (run_dir / "run_secret").read_text() == secret
        nodes = out["summary"]["swarm"]["nodes"]
        assert all(n["rejected"] == 0 and n["accepted"] > 0 for n in nodes.values()), nodes
