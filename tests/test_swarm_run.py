"""`swarmrl run --swarm` end to end: real orchestrator, validator, trainer + adapter and node processes on
127.0.0.1. Cheating nodes are rejected for the right reason and slashed (or their uploads refused), honest
nodes never are, and training reaches its step count, through an orchestrator crash and a killed node."""

from __future__ import annotations

import json
import os
import signal

import pytest
from swarm_support import CAUGHT_BY, _cfg, _check_report, _kill_leftovers, _run_in_thread, _trainer_steps, _wait  # noqa: F401

from swarmrl.utils.metrics import read_metrics


@pytest.mark.timeout(400)
def test_swarm_run_catches_cheats_survives_orchestrator_crash(tiny_model_dir, tmp_path):
    adversaries = ["forge_rewards", "own_tasks", "malformed"]
    cfg = _cfg(tmp_path, tiny_model_dir, adversaries, steps=6)
    run_dir = tmp_path / "run"
    t, out = _run_in_thread(cfg)
    _wait(lambda: _trainer_steps(run_dir) >= 2 or not t.is_alive(), 240, "two trainer steps")
    assert t.is_alive(), out.get("error")
    db = run_dir / "orchestrator" / "orchestrator.db"
    import sqlite3

    with sqlite3.connect(db) as c:
        before = dict(c.execute("select id, status from submissions where status != 'pending'").fetchall())
    pid = json.loads((run_dir / "pids.json").read_text())["orchestrator"]
    os.killpg(pid, signal.SIGKILL)  # crash: the launcher restarts it on the same port and database
    t.join(timeout=360)
    assert not t.is_alive(), "run did not finish"
    assert "error" not in out, out.get("error")
    s = out["summary"]
    assert s["steps"] == 6 and s["mode"] == "swarm"
    with sqlite3.connect(db) as c:
        after = dict(c.execute("select id, status from submissions").fetchall())
    assert all(after[k] == v for k, v in before.items())  # nothing decided before the crash was lost
    assert "orchestrator exited" in (run_dir / "logs" / "orchestrator.log").read_text() or \
        json.loads((run_dir / "pids.json").read_text())["orchestrator"] != pid
    _check_report(s, adversaries)
    # the trainer used accepted work only: every file it consumed came from an honest node
    honest = {n["node_id"][:16] for n in s["swarm"]["nodes"].values() if n["adversary"] is None}
    used = [f for r in read_metrics(run_dir / "metrics" / "trainer.jsonl") if "files" in r for f in r["files"]]
    assert used and all(f.split(".", 1)[1].split("-", 1)[0] in honest for f in used)
    assert (run_dir / "final_model" / "model.safetensors").is_file() and (run_dir / "curves.png").is_file()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_swarm_run_all_adversaries_and_a_killed_node(tiny_model_dir, tmp_path):
    from swarmrl.rl.config import ShardcastSection

    adversaries = list(CAUGHT_BY)  # with weights through SHARDCAST, as in the main job
    # the idle_connections node's rounds fit a run of tens of seconds (its defaults, 10 s before a 20 s round,
    # can miss a short run's honest calls: the attack is then not judged, and the test fails)
    cfg = _cfg(tmp_path, tiny_model_dir, adversaries, nodes=3, steps=16, prompts=8, tasks=2,
               rl_extra={"shardcast": ShardcastSection(enabled=True, relays=1)},
               adversary_set={"idle_delay_s": 2.0, "idle_round_s": 5.0, "idle_rest_s": 3.0})
    run_dir = tmp_path / "run"
    t, out = _run_in_thread(cfg)
    _wait(lambda: _trainer_steps(run_dir) >= 3 or not t.is_alive(), 500, "three trainer steps")
    assert t.is_alive(), out.get("error")
    pid = json.loads((run_dir / "pids.json").read_text())["n2"]
    os.killpg(pid, signal.SIGKILL)  # an honest node dies: its open work is reassigned, training goes on
    t.join(timeout=700)
    assert not t.is_alive() and "error" not in out, out.get("error")
    s = out["summary"]
    assert s["steps"] == 16
    _check_report(s, adversaries)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_swarm_run_toploc_catches_model_and_token_cheats(tiny_model_dir, tmp_path):
    """Without the logprob spot check, TOPLOC proofs (plus its sampling check) catch the same two cheats."""
    pytest.importorskip("swarmrl.toploc", reason="needs swarmrl.toploc (TOPLOC proofs)")
    adversaries = ["random_model", "edit_tokens"]
    cfg = _cfg(tmp_path, tiny_model_dir, adversaries, steps=6, logprob_rows=0)
    t, out = _run_in_thread(cfg)
    t.join(timeout=800)
    assert not t.is_alive() and "error" not in out, out.get("error")
    _check_report(out["summary"], adversaries,
                  {"random_model": ("toploc:", "sampling:"), "edit_tokens": ("toploc:", "sampling:")})


@pytest.mark.timeout(400)
def test_swarm_run_weights_through_shardcast_with_thinking_budgets(tiny_model_dir, tmp_path):
    """With SHARDCAST on, the trainer is the origin, the launcher starts a relay, the adapter announces the relay
    and the manifest key to the orchestrator, and nodes learn both from heartbeats and fetch every policy
    version through the relay (signed manifest, verified shards) instead of reading the run directory.
    Thinking budgets are on: nodes state the assigned budget and score its length penalty, the validator
    re-derives both, and no honest node is rejected."""
    from swarmrl.contract import BudgetRule
    from swarmrl.rl.config import ShardcastSection

    cfg = _cfg(tmp_path, tiny_model_dir, [], steps=4, rl_extra={"shardcast": ShardcastSection(enabled=True, relays=1)},
               contract_extra={"budget": BudgetRule(enabled=True, tiers=[3, 6], penalty=0.05,
                                                    prompt_format="<{target}>{prompt}")})
    run_dir = tmp_path / "run"
    t, out = _run_in_thread(cfg)
    t.join(timeout=360)
    assert not t.is_alive() and "error" not in out, out.get("error")
    assert out["summary"]["steps"] == 4
    relays = json.loads((run_dir / "shardcast" / "relays.json").read_text())
    origin = json.loads((run_dir / "shardcast" / "origin.json").read_text())
    announced = [r for r in read_metrics(run_dir / "metrics" / "adapter.jsonl") if r["event"] == "weights"]
    assert announced and announced[-1]["servers"] == relays and announced[-1]["public_key"] == origin["public_key"]
    assert relays and relays[0] != origin["url"]
    fetched = sorted(p.parent.name for p in (run_dir / "nodes").glob("*/policy/v*/model.safetensors"))
    assert fetched and "v000000" not in fetched  # version 0 is the initial model every node already has
    relay_versions = {p.name for p in (run_dir / "shardcast" / "relay0").rglob("*") if p.is_dir()}
    assert relay_versions, "the relay stored nothing: nodes did not fetch through it"
    for nid in {p.parent.parent.parent.name for p in (run_dir / "nodes").glob("*/policy/v*/model.safetensors")}:
        assert not (run_dir / "nodes" / nid / "policy" / "v000000").exists()
    _check_report(out["summary"], [])
    from swarmrl.models import load_tokenizer
    from swarmrl.rollouts.wire import read_rollouts

    tok = load_tokenizer(tiny_model_dir)
    used = sorted((run_dir / "rollouts").glob("step_*/s*.parquet"))
    assert used
    rows = [r for f in used for r in read_rollouts(f)]
    assert {r.target_length for r in rows} <= {3, 6} and all(r.target_length for r in rows)
    assert all(tok.decode(r.prompt_ids).startswith(f"<{r.target_length}>") for r in rows)
    assert any(r.length_penalty > 0 for r in rows)
