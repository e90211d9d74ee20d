"""`swarmrl run --swarm` end to end: real orchestrator, validator, trainer + adapter and node processes on
127.0.0.1. Cheating nodes are rejected for the right reason and slashed (or their uploads refused), honest
nodes never are, and training reaches its step count, through an orchestrator crash and a killed node."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from swarmrl.envs.config import TaskConfig
from swarmrl.rl.config import EvalSection, RLConfig, WorkerSection
from swarmrl.rl.launcher import RunConfig, WarmstartSection, launch
from swarmrl.swarm.config import SwarmSection
from swarmrl.utils.metrics import read_metrics

# what each adversary must be caught by: a verdict reason prefix, or the HTTP status its uploads get
CAUGHT_BY = {
    "forge_rewards": "rewards:",
    "own_tasks": "tasks:",
    "replay": "schema:",
    "stale_policy": "policy:",
    "random_model": "logprobs:",
    "edit_tokens": "logprobs:",
    "malformed": 422,
    "oversized": 413,
    "wrong_key": 401,
}


def _cfg(tmp_path, model, adversaries, *, nodes=2, steps=6, prompts=4, tasks=2, rl_extra=None, **swarm) -> RunConfig:
    rl = RLConfig(run_dir=str(tmp_path / "run"), model=str(model), task=TaskConfig(name="add", params={"digits": 2}),
                  steps=steps, async_level=1, keep_versions=3, prompts_per_step=prompts, group_size=2,
                  filter_ties=False, eval=EvalSection(every_steps=0, n=16),
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
    from pathlib import Path

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
    cfg = _cfg(tmp_path, tiny_model_dir, adversaries, nodes=3, steps=10, prompts=8, tasks=2,
               rl_extra={"shardcast": ShardcastSection(enabled=True, relays=1)})
    run_dir = tmp_path / "run"
    t, out = _run_in_thread(cfg)
    _wait(lambda: _trainer_steps(run_dir) >= 3 or not t.is_alive(), 500, "three trainer steps")
    assert t.is_alive(), out.get("error")
    pid = json.loads((run_dir / "pids.json").read_text())["n2"]
    os.killpg(pid, signal.SIGKILL)  # an honest node dies: its open work is reassigned, training goes on
    t.join(timeout=700)
    assert not t.is_alive() and "error" not in out, out.get("error")
    s = out["summary"]
    assert s["steps"] == 10
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
    from swarmrl.rl.budget import BudgetConfig
    from swarmrl.rl.config import ShardcastSection

    cfg = _cfg(tmp_path, tiny_model_dir, [], steps=4, rl_extra={
        "shardcast": ShardcastSection(enabled=True, relays=1),
        "budget": BudgetConfig(enabled=True, targets=[3, 6], penalty=0.05, prompt_format="<{target}>{prompt}")})
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
    from swarmrl.rl.rollouts import read_rollouts

    tok = load_tokenizer(tiny_model_dir)
    used = sorted((run_dir / "rollouts").glob("step_*/s*.parquet"))
    assert used
    rows = [r for f in used for r in read_rollouts(f)]
    assert {r.target_length for r in rows} <= {3, 6} and all(r.target_length for r in rows)
    assert all(tok.decode(r.prompt_ids).startswith(f"<{r.target_length}>") for r in rows)
    assert any(r.length_penalty > 0 for r in rows)
