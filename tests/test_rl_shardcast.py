"""The RL loop with weights distributed through SHARDCAST: trainer = origin, a relay, workers fetch."""

import pytest

from swarmrl.config import load_config
from swarmrl.job import RunConfig
from swarmrl.job.launch import launch
from swarmrl.utils.metrics import read_metrics


@pytest.mark.timeout(400)
def test_workers_fetch_policies_through_a_relay(tiny_model_dir, tmp_path):
    cfg = load_config(RunConfig, None, [
        f'rl.run_dir="{tmp_path / "run"}"', f'rl.model="{tiny_model_dir}"', "rl.steps=4", "rl.contract.async_level=1",
        "rl.keep_versions=3", "rl.prompts_per_step=4", "rl.contract.group_size=2", "rl.contract.filter_ties=false",
        'rl.contract.task.name="add"', "rl.contract.task.params.digits=2", "rl.eval.every_steps=0", "rl.eval.n=16",
        "rl.workers.num=1", "rl.workers.prompts_per_batch=4", "rl.shardcast.enabled=true", "rl.shardcast.relays=1",
        "rl.shardcast.shard_size=65536", "final_eval_n=16", "warmstart.enabled=false"])
    summary = launch(cfg, progress=lambda m: None)
    assert summary["steps"] == 4
    run = tmp_path / "run"
    fetches = [r for r in read_metrics(run / "metrics" / "worker-w0.jsonl") if r.get("event") == "fetch"]
    assert fetches, "the worker never fetched a policy through SHARDCAST"
    relay_url = (run / "shardcast" / "relays.json").read_text()
    for f in fetches:
        # every byte came from the relay, none straight from the origin
        assert set(f["bytes_by_server"]) == {u for u in __import__("json").loads(relay_url)}
        assert sum(f["bytes_by_server"].values()) >= f["bytes"]
        assert not f["excluded"]
    # generation used the fetched versions, within the async window
    gens = [r for r in read_metrics(run / "metrics" / "worker-w0.jsonl") if "lag" in r]
    assert max(r["policy_version"] for r in gens) >= 1 and all(r["lag"] <= 1 for r in gens)
    # the origin published the trainer's versions (1..4), numbered by step
    dist = (run / "shardcast" / "origin" / "distribution.txt").read_text().split()
    assert "v4:" in dist


def test_relays_wait_for_the_new_trainers_origin_not_a_stale_one(tmp_path):
    """A resumed run dir still holds the previous trainer's origin.json (an old port): the launchers forget it
    before starting the trainer, so relays are pointed at the origin the new trainer announces."""
    import json
    import subprocess
    import sys
    import threading
    import time

    from swarmrl.job.launch import wait_for_origin
    from swarmrl.rundir.writer import RunDir

    run = RunDir(tmp_path / "run")
    run.announce_origin("http://127.0.0.1:1", "00" * 32)  # from the last run
    fake_trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        run.forget_servers()
        t = threading.Timer(0.5, lambda: run.announce_origin("http://127.0.0.1:2", "11" * 32))
        t.start()
        t0 = time.monotonic()
        origin = wait_for_origin(run, fake_trainer, tmp_path, timeout_s=10)
        assert origin["url"] == "http://127.0.0.1:2" and time.monotonic() - t0 >= 0.4
        assert json.loads(run.origin_file.read_text()) == origin
    finally:
        fake_trainer.kill()
        fake_trainer.wait()
