"""The network harness (swarmrl.wan): profiles, namespaces made and removed (also when its owner is killed),
link-local addresses with no route out, refusal without the rights, and links that give what their profile
says (round trip, throughput, loss), measured between namespaces through the core."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from swarmrl.wan import measure, netns
from swarmrl.wan.harness import Harness
from swarmrl.wan.netns import WanUnavailable
from swarmrl.wan.profiles import Link, link_plan, load_profiles

ROOT = Path(__file__).resolve().parents[1]


_NO_RIGHTS = netns.rights_problem()  # one probe, at collection


needs_rights = pytest.mark.skipif(bool(_NO_RIGHTS), reason=_NO_RIGHTS or "ok")


def test_profiles_name_known_links_and_plan_roles():
    pf = load_profiles()
    assert {"datacenter", "wan100", "wan20lossy", "mixed"} <= set(pf.profiles)
    plan = link_plan("mixed", ["orchestrator", "trainer", "validator", "relay0", "n0", "n1", "n2"])
    assert plan["orchestrator"] == pf.links["dc"] and plan["relay0"] == pf.links["dc"]
    assert [plan[n] for n in ("n0", "n1", "n2")] == [pf.links["wan100"], pf.links["wan20lossy"], pf.links["wan100"]]
    assert link_plan("datacenter", ["n0", "n1"], {"n1": "wan20lossy"})["n1"].loss == 0.005
    assert not pf.links["dc"].wired and pf.links["wan100"].wired
    with pytest.raises(ValueError, match="unknown network profile"):
        link_plan("moon", ["n0"])
    with pytest.raises(ValueError, match="unknown links"):
        link_plan("wan100", ["n0"], {"n0": "carrier-pigeon"})


def test_refuses_without_the_rights(monkeypatch):
    monkeypatch.setattr(netns, "_caps", lambda: 0)
    with pytest.raises(WanUnavailable, match="CAP_NET_ADMIN"):
        Harness({"a": Link()}).up()


@pytest.mark.skipif(not Path("/usr/bin/unshare").exists(), reason="no unshare")
def test_refuses_in_a_user_namespace_of_its_own():
    """Under ``unshare -U`` the capability bits are all set, but only over the new user namespace: the probe
    namespace fails and the harness says why instead of crashing half-way."""
    code = "from swarmrl.wan.harness import Harness\nfrom swarmrl.wan.profiles import Link\n" \
           "try:\n    Harness({'a': Link()}).up()\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
    r = subprocess.run(["unshare", "-U", sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    if r.returncode != 0 and "unshare" in r.stderr:
        pytest.skip(f"unshare -U not allowed here: {r.stderr.strip()}")
    assert r.stdout.startswith("WanUnavailable"), (r.stdout, r.stderr)
    assert not [n for n in netns.listed() if "probe" in n]


@needs_rights
def test_sets_up_link_local_namespaces_with_no_route_out_and_removes_them():
    before_root = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    h = Harness.for_profile("mixed", ["orchestrator", "n0", "n1"])
    with h:
        mine = [n for n in netns.listed() if n.startswith(h.prefix)]
        assert sorted(mine) == sorted([h.hub, *h.netns.values()])
        for role, ns in h.netns.items():
            routes = netns.ip("route", ns=ns)
            assert "default" not in routes and "169.254.0.0/16" in routes, routes
            addrs = netns.ip("-o", "-4", "addr", ns=ns)
            assert h.hosts[role] in addrs and all(a.startswith(("127.", "169.254.")) for a in
                                                   [w.split("/")[0] for w in addrs.split() if "/" in w and "." in w])
        assert "169.254." not in subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
        assert "169.254." not in subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
        # a role cannot reach the machine's own loopback services through the core (its 127.0.0.1 is its own)
        assert measure.rtt_ms(h, "n0", "n1", n=3)["median"] > 150  # 50 ms + 150 ms links
    assert not [n for n in netns.listed() if n.startswith(h.prefix)]
    assert subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout == before_root


@needs_rights
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_namespaces_go_when_their_owner_dies(sig):
    """The wire keeps watch: when the process that made the harness dies (even by SIGKILL), it removes the
    namespaces."""
    code = ("import time\nfrom swarmrl.wan.harness import Harness\n"
            "h = Harness.for_profile('wan100', ['orchestrator', 'n0']).up()\nprint(h.prefix, flush=True)\n"
            "time.sleep(120)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    prefix = p.stdout.readline().strip()
    assert prefix and [n for n in netns.listed() if n.startswith(prefix)]
    p.send_signal(sig)
    p.wait(30)
    deadline = time.monotonic() + 20
    while [n for n in netns.listed() if n.startswith(prefix)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [n for n in netns.listed() if n.startswith(prefix)]


@needs_rights
def test_stale_namespaces_of_dead_runs_are_removed():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    name = f"swrl{dead}xabcd-hub"
    netns.add(name)
    assert name in netns.listed()
    assert name in netns.clean_stale()
    assert name not in netns.listed()


@needs_rights
@pytest.mark.timeout(120)
def test_links_give_their_profile():
    """wan100 node to a datacenter server: ~50 ms round trip and under 100 Mbit/s, most of it on a long
    transfer; wan20lossy: ~150 ms, and ~0.5% of datagrams lost each way."""
    with Harness.for_profile("mixed", ["orchestrator", "n0", "n1"], seed=3) as h:
        rtt = measure.rtt_ms(h, "n0", "orchestrator", n=10)
        assert 49 <= rtt["median"] <= 60, rtt
        thr = measure.throughput_mbit(h, "orchestrator", "n0", nbytes=24 << 20)
        assert 50 <= thr["mbit_s"] <= 101, thr
        assert 149 <= measure.rtt_ms(h, "n1", "orchestrator", n=5)["median"] <= 165
        lost = _udp_loss(h, "n1", "orchestrator", 3000)
        assert 0.001 <= lost <= 0.015, lost


def _udp_loss(h: Harness, src: str, dst: str, n: int) -> float:
    """Share of ``n`` datagrams (paced well under the rate) from ``src`` that never reach ``dst``."""
    with netns.inside(h.netns[dst]):
        r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        r.bind((h.hosts[dst], 0))
    with netns.inside(h.netns[src]):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    r.settimeout(1.0)
    got = [0]

    def recv() -> None:  # at once, so the receiver's buffer never overflows
        try:
            while got[0] < n:
                r.recv(64)
                got[0] += 1
        except TimeoutError:
            pass

    t = threading.Thread(target=recv, daemon=True)
    with r, s:
        t.start()
        for i in range(n):
            s.sendto(json.dumps(i).encode(), r.getsockname())
            if i % 50 == 49:
                time.sleep(0.01)
        t.join(30)
    return 1 - got[0] / n


def test_a_network_profile_places_each_role_on_its_namespace_address():
    """derive: under a placement, the orchestrator listens on and is reached at its namespace's address, the
    trainer's origin announces its own, relays listen on theirs, and each role runs in its namespace (the adapter
    in its trainer's); without one, everything stays on 127.0.0.1 in the launcher's namespace."""
    import hashlib

    from swarmrl.job import RunConfig
    from swarmrl.job.config import WanSection
    from swarmrl.job.derive import Identity, Placement, derive_swarm, member_names, relay_roles
    from swarmrl.job.launch import wan_roles
    from swarmrl.rl.config import RLConfig, ShardcastSection

    def ident(name: str) -> Identity:
        h = hashlib.sha256(name.encode()).hexdigest()
        return Identity(f"/keys/{name}.pem", h, h[:32])

    cfg = RunConfig(mode="swarm", rl=RLConfig(shardcast=ShardcastSection(enabled=True, relays=1)),
                    wan=WanSection(profile="mixed"))
    roles = wan_roles(cfg)
    assert roles == ["orchestrator", "trainer", "validator", "relay0", "n0", "n1"]
    place = Placement({r: f"169.254.{i + 1}.2" for i, r in enumerate(roles)}, {r: f"ns-{r}" for r in roles})
    members = {n: ident(n) for n in member_names(cfg)}
    args = (cfg, Path("/run/x"), 8765, "s3cret", ident("v"), ident("t"), members, ident("a"), 8600)
    plan = derive_swarm(*args, place=place)
    assert plan.url == "http://169.254.1.2:8765" and plan.orchestrator.host == "169.254.1.2"
    assert plan.rl.shardcast.origin_host == "169.254.2.2" and plan.validator.orchestrator == plan.url
    assert {r.name: r.netns for r in plan.roles} == {"orchestrator": "ns-orchestrator", "trainer": "ns-trainer",
                                                      "adapter": "ns-trainer", "validator": "ns-validator",
                                                      "n0": "ns-n0", "n1": "ns-n1"}
    assert plan.role("n1").argv[plan.role("n1").argv.index("--orchestrator") + 1] == plan.url
    relays, urls = relay_roles(1, Path("/run/x"), "http://169.254.2.2:8600", "ab" * 32, [9000], place=place)
    assert urls == ["http://169.254.4.2:9000"] and relays[0].netns == "ns-relay0"
    assert "host=169.254.4.2" in relays[0].argv
    plain = derive_swarm(*args)
    assert plain.url == "http://127.0.0.1:8765" and not any(r.netns for r in plain.roles)
    assert plain.rl.shardcast.origin_host == "127.0.0.1"
    with pytest.raises(ValueError, match="needs mode"):
        RunConfig(mode="local", wan=WanSection(profile="wan100"))
    with pytest.raises(ValueError, match="unknown network profile"):
        RunConfig(mode="swarm", wan=WanSection(profile="moon"))


@pytest.mark.skipif(not Path("/usr/bin/unshare").exists(), reason="no unshare")
def test_swarmrl_run_under_a_profile_refuses_without_rights_before_anything_runs(tmp_path):
    run_dir = tmp_path / "run"
    r = subprocess.run(["unshare", "-U", sys.executable, "-m", "swarmrl", "run", "-c", str(ROOT / "configs" / "run.toml"),
                        "--set", 'wan.profile="wan100"', "--set", f'rl.run_dir="{run_dir}"'],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    if r.returncode != 2 and "unshare" in r.stderr:
        pytest.skip(f"unshare -U not allowed here: {r.stderr.strip()}")
    assert r.returncode == 2 and "network harness needs" in r.stderr, (r.returncode, r.stderr)
    assert not run_dir.exists() and not (tmp_path / "runs").exists()  # no warm start, no run dir
