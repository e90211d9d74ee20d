"""kill -9 the trainer and a worker mid-run: both restart, the run completes, no step is trained twice."""

import json
import os
import signal
import subprocess
import sys

import pytest

from swarmrl.config import dump_config
from swarmrl.contract import RLContract
from swarmrl.envs.config import TaskConfig
from swarmrl.rl.config import EvalSection, RLConfig, WorkerSection
from swarmrl.rundir.writer import RunDir
from swarmrl.utils.metrics import read_metrics
from tests.swarm_support import _wait


def _spawn(args, log):
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "swarmrl", *args], stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)


@pytest.mark.timeout(420)
def test_kill_and_resume(tiny_model_dir, tmp_path):
    steps = 24  # room to kill the trainer mid-run (8 could all be trained between two polls of the wait)
    cfg = RLConfig(run_dir=str(tmp_path / "run"), model=str(tiny_model_dir), contract=RLContract(task=TaskConfig(name="add", params={"digits": 2}), async_level=1, group_size=2, filter_ties=False),
                   steps=steps, keep_versions=3, prompts_per_step=4,
                   eval=EvalSection(every_steps=0, n=16),
                   workers=WorkerSection(num=1, prompts_per_batch=4))
    cfg_path = tmp_path / "rl.toml"
    cfg_path.write_text(dump_config(cfg))
    run = RunDir(cfg.run_dir)
    logs = tmp_path
    trainer = _spawn(["rl", "trainer", "--config", str(cfg_path)], logs / "trainer.log")
    worker = _spawn(["rl", "worker", "--config", str(cfg_path), "--id", "w0"], logs / "w0.log")
    try:
        _wait(lambda: (run.latest_version() or 0) >= 3, 240, "version 3")
        os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait()
        killed_at = run.latest_version()
        assert killed_at < steps, f"the trainer finished all {steps} steps before it was killed"
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        assert not run.is_done()
        trainer = _spawn(["rl", "trainer", "--config", str(cfg_path)], logs / "trainer.log")
        worker = _spawn(["rl", "worker", "--config", str(cfg_path), "--id", "w0"], logs / "w0.log")
        assert trainer.wait(timeout=300) == 0, (logs / "trainer.log").read_text()[-3000:]
        worker.wait(timeout=60)
    finally:
        for p in (trainer, worker):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert run.latest_version() == steps and run.is_done()
    rows = [r for r in read_metrics(run.metrics / "trainer.jsonl") if "reward" in r]
    trained_steps = [r["step"] for r in rows]
    # every step trained exactly once (a step killed in flight was never committed, so it has no row)
    assert sorted(trained_steps) == list(range(steps)), trained_steps
    assert len(set(trained_steps)) == len(trained_steps)
    # the restarted trainer continued from the committed version, not from scratch
    assert killed_at >= 3 and trained_steps.index(killed_at) > 0
    files = [f for r in rows for f in r["files"]]
    assert len(files) == len(set(files)), "a rollout file was used by two steps"
    # versions kept: only the last keep_versions directories remain
    kept = sorted(p.name for p in run.policy.glob("v*"))
    assert kept == [f"v{v:06d}" for v in range(steps - cfg.keep_versions + 1, steps + 1)]
    # the restarted worker rejoined and produced rollouts for late steps
    wrows = read_metrics(run.metrics / "worker-w0.jsonl")
    assert max(r["step"] for r in wrows) == steps - 1
    assert all(r["lag"] <= cfg.contract.async_level for r in wrows)
    assert json.loads(json.dumps(rows[-1]))["lag_max"] <= cfg.contract.async_level
