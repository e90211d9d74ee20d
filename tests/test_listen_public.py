"""`swarmrl run` beyond loopback (issue 39, the operator's side): with ``swarm.listen = "0.0.0.0"`` the orchestrator,
the trainer's SHARDCAST origin and the relays listen on every address and are announced at ``swarm.public_host``,
while the run's own roles keep reaching them on 127.0.0.1; a wildcard without a public host, or a listen address
beside a network profile, is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from test_job import _id

from swarmrl.job import RunConfig
from swarmrl.job.derive import Placement, derive_swarm, member_names, relay_roles
from swarmrl.job.launch import join_line


def _cfg(**swarm) -> RunConfig:
    return RunConfig(mode="swarm", rl={"shardcast": {"enabled": True, "relays": 1}}, swarm=swarm)


def _plan(cfg: RunConfig, tmp: Path):
    place = Placement.public(cfg.swarm.listen, cfg.swarm.advertised(), ("orchestrator", "trainer", "relay0"))
    members = {n: _id(n) for n in member_names(cfg)}
    return derive_swarm(cfg, tmp, 8765, "s3cret" * 4, _id("validator"), _id("trainer"), members, _id("authority"),
                        origin_port=8600, place=place), place


def test_servers_listen_everywhere_and_are_announced_at_the_public_host(tmp_path):
    cfg = _cfg(listen="0.0.0.0", public_host="swarm.example.org")
    plan, place = _plan(cfg, tmp_path)
    assert plan.orchestrator.host == "0.0.0.0"
    assert plan.public_url == "http://swarm.example.org:8765"  # what other machines get
    assert plan.url == "http://127.0.0.1:8765"  # the run's own roles: no detour through the public name
    assert all(plan.url in " ".join(r.argv) for r in plan.roles if r.name in ("adapter", "n0"))
    sc = plan.rl.shardcast
    assert (sc.origin_host, sc.origin_public_host, sc.origin_port) == ("0.0.0.0", "swarm.example.org", 8600)
    roles, urls = relay_roles(1, tmp_path, place.local_url("trainer", 8600), "ab" * 32, [8601], place=place)
    assert urls == ["http://swarm.example.org:8601"]
    assert "host=0.0.0.0" in roles[0].argv and "http://127.0.0.1:8600" in roles[0].argv
    (tmp_path / "orchestrator").mkdir()
    assert "swarmrl node join http://swarm.example.org:8765 --run-key " in join_line(plan)


def test_loopback_stays_as_it_was(tmp_path):
    plan, _ = _plan(_cfg(), tmp_path)
    assert plan.orchestrator.host == "127.0.0.1" and plan.url == plan.public_url == "http://127.0.0.1:8765"
    assert plan.rl.shardcast.origin_public_host == ""


@pytest.mark.parametrize("swarm,wan,why", [
    ({"listen": "0.0.0.0"}, {}, "set swarm.public_host"),
    ({"listen": "::"}, {}, "set swarm.public_host"),
    ({"listen": "0.0.0.0", "public_host": "http://x:1"}, {}, "public_host"),
    ({"listen": "0.0.0.0", "public_host": "x.org"}, {"profile": "wan100"}, "use one or the other"),
])
def test_what_cannot_work_is_refused(swarm, wan, why):
    with pytest.raises(ValidationError, match=why):
        RunConfig(mode="swarm", swarm=swarm, wan=wan)
