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
from swarmrl.protocol.config import DEFAULT_RUN_SECRET, OrchestratorConfig
from swarmrl.rl.config import ShardcastSection


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
    ({"listen": "0.0.0.0", "public_host": "10.1.2.3:8080"}, {}, "without a scheme, port or path"),
    ({"listen": "0.0.0.0", "public_host": "x.org/swarm"}, {}, "without a scheme, port or path"),
    ({"listen": "0.0.0.0", "public_host": "0.0.0.0"}, {}, "names no machine"),
    ({"listen": "every address"}, {}, "swarm.listen"),
    ({"listen": "0.0.0.0", "public_host": "x.org"}, {"profile": "wan100"}, "use one or the other"),
])
def test_what_cannot_work_is_refused(swarm, wan, why):
    with pytest.raises(ValidationError, match=why):
        RunConfig(mode="swarm", swarm=swarm, wan=wan)


def test_an_ip_public_host_and_ipv6_in_urls(tmp_path):
    cfg = _cfg(listen="0.0.0.0", public_host="10.1.2.3")
    plan, _ = _plan(cfg, tmp_path)
    assert plan.public_url == "http://10.1.2.3:8765" and plan.rl.shardcast.origin_public_host == "10.1.2.3"
    v6 = _cfg(listen="[::]", public_host="2001:db8::7")
    assert (v6.swarm.listen, v6.swarm.advertised()) == ("::", "[2001:db8::7]")  # bound bare, announced in brackets
    plan6, place6 = _plan(v6, tmp_path / "v6")
    assert plan6.orchestrator.host == "::" and plan6.public_url == "http://[2001:db8::7]:8765"
    assert plan6.url == "http://127.0.0.1:8765"
    assert relay_roles(1, tmp_path, "http://127.0.0.1:8600", "ab" * 32, [8601], place=place6)[1] == \
        ["http://[2001:db8::7]:8601"]


def test_an_origin_on_every_address_must_be_named():
    with pytest.raises(ValidationError, match="origin_public_host"):
        ShardcastSection(origin_host="0.0.0.0")
    assert ShardcastSection(origin_host="0.0.0.0", origin_public_host="x.org").origin_public_host == "x.org"


def test_the_orchestrator_listens_everywhere_with_the_runs_own_secret(tmp_path):
    """The plan's orchestrator config on 0.0.0.0 (the run's fresh secret passes the refusal of the public default
    off loopback) serves, reached here through 127.0.0.1."""
    import threading  # noqa: PLC0415
    import time  # noqa: PLC0415

    import httpx  # noqa: PLC0415
    import uvicorn  # noqa: PLC0415

    from swarmrl.protocol.orchestrator import Orchestrator, create_app  # noqa: PLC0415

    plan, _ = _plan(_cfg(listen="0.0.0.0", public_host="swarm.example.org"), tmp_path)
    with pytest.raises(ValidationError, match="default run secret"):
        OrchestratorConfig(**{**plan.orchestrator.model_dump(), "run_secret": DEFAULT_RUN_SECRET})
    ocfg = plan.orchestrator.model_copy(update={"port": 0})
    orch = Orchestrator(ocfg)
    server = uvicorn.Server(uvicorn.Config(create_app(ocfg, orch, run_sweeper=False), host=ocfg.host, port=0,
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        assert host == "0.0.0.0"
        assert httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=10).status_code == 200
    finally:
        server.should_exit = True
        thread.join(10)
        orch.db.dispose()
