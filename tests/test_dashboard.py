"""The dashboard and its stats API: a real orchestrator on a socket (page, live stats after nodes register and
heartbeat, bounds, OpenAPI), the trainer's records kept per version, the run-directory server of `swarmrl run
--local`, and the adapter posting the trainer's metrics with its step."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest
from dashboard_support import STEPS, live_swarm
from protocol_support import make_cfg

from swarmrl.dashboard.schemas import MAX_NODES, MAX_POINTS, TrainerPoint
from swarmrl.dashboard.server import DashboardServer
from swarmrl.protocol.orchestrator import Orchestrator
from swarmrl.protocol.orchestrator.run_state import MAX_TRAINER_METRICS
from swarmrl.protocol.schemas import StepRequest
from swarmrl.protocol.tables import TrainerMetric


def test_orchestrator_serves_dashboard_and_live_stats(tmp_path):
    with live_swarm(tmp_path) as sw:
        url, (good, cheat, waiting) = sw["url"], sw["nodes"]
        page = httpx.get(url + "/dashboard")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "<svg" in page.text and "v1/stats/overview" in page.text and "<script src" not in page.text
        # self-contained: nothing loaded from elsewhere (the SVG namespace is a name, not a fetch)
        assert re.findall(r"https?://[^\s\"']+", page.text) == ["http://www.w3.org/2000/svg"]

        o = httpx.get(url + "/v1/stats/overview").json()
        assert o["mode"] == "swarm" and o["step"] == STEPS and o["policy_version"] == STEPS
        assert o["nodes"] == {"active": 2, "ejected": 1}
        assert o["validation"]["pending"] == 1 and o["validation"]["accepted"] == 1
        assert o["validation"]["rejected"] == 1 and o["validation"]["oldest_pending_age_s"] >= 0

        nodes = httpx.get(url + "/v1/stats/nodes").json()
        assert nodes["total"] == 3 and nodes["limit"] == MAX_NODES
        by_id = {n["node_id"]: n for n in nodes["items"]}
        assert [n["status"] for n in nodes["items"]] == ["active", "active", "ejected"]  # active first
        assert by_id[good]["accepted"] == 1 and by_id[good]["stake"] == 100.0 and by_id[good]["credits"] > 0
        assert by_id[cheat]["rejected"] == 1 and by_id[cheat]["slashes"] == 1 and by_id[cheat]["stake"] == 50.0
        assert by_id[waiting]["pending"] == 1 and by_id[waiting]["throughput"] == 300.0
        assert by_id[good]["policy_version"] in (0, STEPS) and by_id[cheat]["policy_version"] == 0
        # heartbeats are live: last_seen moves
        seen = by_id[waiting]["last_seen"]
        time.sleep(1.3)  # past the stats cache and a few beats
        again = {n["node_id"]: n for n in httpx.get(url + "/v1/stats/nodes").json()["items"]}
        assert again[waiting]["last_seen"] > seen
        assert httpx.get(url + "/v1/stats/nodes", params={"limit": 1}).json()["items"][0]["node_id"] == waiting

        curves = httpx.get(url + "/v1/stats/trainer").json()
        assert [p["version"] for p in curves["points"]] == list(range(STEPS + 1)) and curves["total"] == STEPS + 1
        assert curves["points"][0]["heldout_acc"] == 0.25 and curves["points"][2]["loss"] == pytest.approx(0.25)

        pol = httpx.get(url + "/v1/stats/policy").json()
        assert pol["policy_version"] == STEPS and pol["servers"] == ["http://127.0.0.1:9/relay-a",
                                                                     "http://127.0.0.1:9/relay-b"]
        # the honest nodes' heartbeats got work at the new version; the ejected one's last work was at 0
        assert pol["spread"] == [{"version": STEPS, "nodes": 2}, {"version": 0, "nodes": 1}]

        # bounded: limits above the caps are refused, not served
        assert httpx.get(url + "/v1/stats/nodes", params={"limit": MAX_NODES + 1}).status_code == 422
        assert httpx.get(url + "/v1/stats/trainer", params={"limit": MAX_POINTS + 1}).status_code == 422
        spec = httpx.get(url + "/openapi.json").json()
        for p in ("/dashboard", "/v1/stats/overview", "/v1/stats/nodes", "/v1/stats/trainer", "/v1/stats/policy"):
            assert p in spec["paths"], p
        assert {"NodeList", "TrainerCurves", "PolicyStats", "Overview"} <= set(spec["components"]["schemas"])


def test_stats_are_rate_limited_like_the_public_views(tmp_path):
    cfg, _ = make_cfg(tmp_path, public_rate_per_s=0.01, public_burst=3)
    from protocol_support import running

    with running(cfg) as srv:
        codes = [httpx.get(srv.url + p).status_code for p in ("/v1/stats/overview", "/dashboard",
                                                              "/v1/stats/trainer", "/v1/stats/policy")]
    assert codes == [200, 200, 200, 429]


def test_trainer_records_merge_per_version_and_stay_bounded(tmp_path):
    cfg, _ = make_cfg(tmp_path)
    orch = Orchestrator(cfg)
    try:
        orch.run.set_step(StepRequest(step=1, policy_version=1, metrics=[TrainerPoint(version=1, step=0, loss=1.0)]))
        orch.run.set_step(StepRequest(step=1, policy_version=1, metrics=[TrainerPoint(version=1, heldout_acc=0.5)]))
        orch.stats._cache.clear()
        pts = orch.stats.trainer().points
        assert [(p.version, p.loss, p.heldout_acc) for p in pts] == [(1, 1.0, 0.5)]
        far = MAX_TRAINER_METRICS + 5
        orch.run.set_step(StepRequest(step=far, policy_version=far, metrics=[TrainerPoint(version=far, loss=2.0)]))
        with orch.db.tx() as s:
            assert s.query(TrainerMetric).count() == 1  # version 1 fell out of the kept window
    finally:
        orch.close()
    with pytest.raises(ValueError):  # NaN is refused in the request (the adapter sends null instead)
        StepRequest(step=1, policy_version=1, metrics=[TrainerPoint(version=1, loss=float("nan"))])
    with pytest.raises(ValueError):
        StepRequest(step=1, policy_version=1, metrics=[TrainerPoint(version=v) for v in range(65)])


def _write_rows(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def test_local_run_dashboard_server_reads_the_run_dir(tmp_path):
    root = tmp_path / "run"
    now = time.time()
    _write_rows(root / "metrics" / "trainer.jsonl", [
        {"event": "eval", "step": 0, "version": 0, "heldout_acc": 0.2, "wall_s": 0.0, "time": now},
        *({"step": s, "version": s + 1, "reward": 0.1 * s, "task_reward": 0.1 * s, "loss": float("nan") if s == 1
           else 1.0 / (s + 1), "lag_mean": 0.5, "wall_s": s, "time": now} for s in range(4)),
        {"event": "waiting", "step": 4}])
    _write_rows(root / "metrics" / "worker-w0.jsonl", [{"worker": "w0", "step": 3, "policy_version": 3,
                                                        "tokens_per_s": 50.0, "time": now}])
    _write_rows(root / "metrics" / "worker-w1.jsonl", [{"worker": "w1", "step": 1, "policy_version": 1,
                                                        "tokens_per_s": 20.0, "time": now - 600}])
    (root / "policy").mkdir(parents=True)
    (root / "policy" / "LATEST").write_text("4")
    (root / "shardcast").mkdir()
    (root / "shardcast" / "origin.json").write_text(json.dumps({"url": "http://127.0.0.1:1", "public_key": "ab"}))
    (root / "shardcast" / "relays.json").write_text(json.dumps(["http://127.0.0.1:2"]))
    dash = DashboardServer(root).start()
    try:
        base = dash.url.removesuffix("/dashboard")
        page = httpx.get(dash.url)
        assert page.status_code == 200 and "<svg" in page.text
        o = httpx.get(base + "/v1/stats/overview").json()
        assert o == {**o, "mode": "local", "step": 4, "policy_version": 4, "nodes": {"active": 1, "idle": 1},
                     "validation": None}
        nodes = httpx.get(base + "/v1/stats/nodes").json()
        assert [(n["node_id"], n["status"], n["policy_version"]) for n in nodes["items"]] == \
            [("w0", "active", 3), ("w1", "idle", 1)]
        pts = httpx.get(base + "/v1/stats/trainer", params={"limit": 3}).json()
        assert pts["total"] == 5 and [p["version"] for p in pts["points"]] == [2, 3, 4]
        assert pts["points"][0]["loss"] is None  # NaN in the file: null in the API
        pol = httpx.get(base + "/v1/stats/policy").json()
        assert pol["servers"] == ["http://127.0.0.1:2"] and pol["origin"] == "http://127.0.0.1:1"
        assert pol["spread"] == [{"version": 3, "nodes": 1}, {"version": 1, "nodes": 1}]
        assert httpx.get(base + "/v1/stats/nope").status_code == 404
    finally:
        dash.stop()


class _FakeTrainerClient:
    def __init__(self) -> None:
        self.calls = []

    def set_step(self, step, policy_version, metrics=None):
        self.calls.append((step, [p.version for p in metrics or []]))

    def accepted(self, step):
        from swarmrl.protocol.schemas import AcceptedList

        return AcceptedList(step=step, optimistic=False, items=[])


def test_adapter_posts_the_trainers_records_with_its_step(tmp_path):
    from swarmrl.rl.config import RLConfig
    from swarmrl.swarm.adapter import AdapterConfig, TrainerAdapter

    rl = RLConfig(run_dir=str(tmp_path / "run"), steps=10)
    client = _FakeTrainerClient()
    ad = TrainerAdapter(rl, AdapterConfig(), client=client)
    (tmp_path / "run" / "policy" / "LATEST").write_text("1")
    _write_rows(tmp_path / "run" / "metrics" / "trainer.jsonl",
                [{"event": "eval", "step": 0, "version": 0, "heldout_acc": 0.2}])
    ad.poll_once()
    with open(tmp_path / "run" / "metrics" / "trainer.jsonl", "a") as f:
        f.write(json.dumps({"step": 0, "version": 1, "reward": 0.5, "loss": 0.1}) + "\n" + '{"step": 1, "ver')
    ad.poll_once()  # same version: the new record goes alone; the torn line waits
    ad.poll_once()  # nothing new: no call
    assert client.calls == [(1, [0]), (1, [1])]
