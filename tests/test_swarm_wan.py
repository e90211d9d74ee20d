"""`swarmrl run` over emulated network links (swarmrl.wan): every role in a network namespace of its own, the
servers on datacenter links, one node on 100 Mbit/s with a 50 ms round trip and one on 20 Mbit/s, 150 ms,
0.5% loss each way. The run finishes with nothing lost: every step trained, the slow lossy node's work accepted,
no honest node rejected, refused or slashed, every policy fetched through the relay over the links, and no
namespace left behind."""

from __future__ import annotations

import json

import pytest
from swarm_support import _cfg, _check_report, _kill_leftovers, _run_in_thread  # noqa: F401

from swarmrl.job.config import WanSection
from swarmrl.wan import netns

_NO_RIGHTS = netns.rights_problem()  # one probe, at collection


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(bool(_NO_RIGHTS), reason=_NO_RIGHTS or "ok")
def test_swarm_run_over_wan_links_with_a_slow_lossy_node(tiny_model_dir, tmp_path):
    from swarmrl.rl.config import ShardcastSection

    cfg = _cfg(tmp_path, tiny_model_dir, [], nodes=2, steps=6, rl_extra={"shardcast": ShardcastSection(enabled=True,
                                                                                                      relays=1)})
    cfg = cfg.model_copy(update={"wan": WanSection(profile="wan100", links={"n1": "wan20lossy"}, seed=1)})
    run_dir = tmp_path / "run"
    before = set(netns.listed())
    t, out = _run_in_thread(cfg)
    t.join(timeout=560)
    assert not t.is_alive() and "error" not in out, out.get("error")
    s = out["summary"]
    assert s["steps"] == 6
    _check_report(s, [])
    nodes = s["swarm"]["nodes"]
    assert all(n["accepted"] >= 1 and n["status"] == "active" for n in nodes.values()), nodes
    wan = json.loads((run_dir / "wan.json").read_text())
    assert wan["roles"]["n1"]["link"].endswith("0.5% loss") and "50 ms" in wan["roles"]["n0"]["link"]
    hosts = {r: v["host"] for r, v in wan["roles"].items()}
    assert s["swarm"]["orchestrator"] == f"http://{hosts['orchestrator']}:{s['swarm']['orchestrator'].rsplit(':', 1)[1]}"
    relays = json.loads((run_dir / "shardcast" / "relays.json").read_text())
    origin = json.loads((run_dir / "shardcast" / "origin.json").read_text())
    assert relays[0].startswith(f"http://{hosts['relay0']}:") and origin["url"].startswith(f"http://{hosts['trainer']}:")
    fetched = list((run_dir / "nodes").glob("*/policy/v*/model.safetensors"))
    assert len({p.parts[-4] for p in fetched}) == 2, fetched  # both nodes fetched policies over their links
    assert set(netns.listed()) <= before  # every namespace of the run is gone
    # the lossy link really lost packets (both ways), the other one none, and TCP carried the run through
    stats = json.loads([ln for ln in (run_dir / "logs" / "wire.log").read_text().splitlines() if '"stats"' in ln][-1])
    lost = {d["name"].rsplit("-", 1)[1]: d["lost"] for d in stats["stats"]}
    assert lost["n1 up"] > 0 and lost["n1 down"] > 0 and lost["n0 up"] == lost["n0 down"] == 0, stats
