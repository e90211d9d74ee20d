"""DiLoCo and DDP across continents: every worker in a network namespace of its own behind an emulated link.

``run_wan(cfg, profile)`` is ``swarmrl.diloco.launch.run`` under the network harness (``swarmrl.wan``): a
``Harness`` with roles ``w0 .. w{W-1}`` on the profile's node link(s) (``datacenter``: 1 Gbit/s; ``wan100``:
100 Mbit/s, +50 ms; ``wan20lossy``: 20 Mbit/s, +150 ms, 0.5% loss each way), so two workers talk through both
of their links (wan20lossy: a 300 ms round trip, loss on each link). Each worker is started with ``ip netns exec``
in its role's namespace, in a session of its own, with ``child_env`` (it dies with this process; its process group
is killed when the run ends), and:

* the workers' addresses: the harness gives each role a link-local address (169.254.L.2), which libp2p refuses
  to dial ("undialable IP"), so each link gets a second address pair from the benchmarking range
  (``198.18.L.2`` on the role side, ``198.18.L.1`` in the core, RFC 2544) and a route to 198.18.0.0/16 through
  the core: the same devices, so the same rate, delay and loss. Both backends use these addresses;
* torch.distributed: ``MASTER_ADDR`` is w0's address, the port one that is free there, and gloo is told to use
  the namespace's link (``GLOO_SOCKET_IFNAME=wan0``: the machine's host name does not resolve inside);
* hivemind: each worker's DHT and p2p daemon bind to and announce its address (``hivemind.host``); rank 0
  writes its multiaddrs to the peers file in ``out`` (the file system is shared).

Before the workers start, the round trip w1 -> w0 is measured through the core (``swarmrl.wan.measure``). The
summary is launch's plus ``wan`` (profile, links, hosts, measured round trip), each worker's compute utilization
(``worker.py``: time in inner steps over the training loop's wall time less its evaluation and logging) and the
remote addresses of each worker's TCP connections (``tcp_peers``: the namespace addresses of its peers).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from swarmrl.diloco.config import DilocoConfig
from swarmrl.diloco.launch import _env, summarize, wait_all
from swarmrl.utils.procs import child_env, free_port
from swarmrl.wan import measure, netns
from swarmrl.wan.harness import Harness
from swarmrl.wan.netns import ip

__all__ = ["roles", "routable_hosts", "run_wan", "worker_configs"]

LINK_DEV = "wan0"  # the role side of every harness link
ROUTABLE = "198.18"  # RFC 2544's benchmarking range: not link-local, so libp2p dials it


def roles(workers: int) -> list[str]:
    return [f"w{r}" for r in range(workers)]


def routable_hosts(h: Harness) -> dict[str, str]:
    """Give each of ``h``'s links a second address pair in 198.18.0.0/16 (role side .L.2, core side .L.1) and each
    role a route to that range through the core; returns each role's new address. The namespaces go with the
    harness, and these addresses with them."""
    hosts = {}
    for role, i in h.index.items():
        ns, addr = h.netns[role], f"{ROUTABLE}.{i}.2"
        ip("addr", "add", f"{addr}/24", "dev", LINK_DEV, ns=ns)
        ip("addr", "add", f"{ROUTABLE}.{i}.1/24", "dev", f"l{i}", ns=h.hub)
        ip("route", "add", f"{ROUTABLE}.0.0/16", "via", f"{ROUTABLE}.{i}.1", "dev", LINK_DEV, ns=ns)
        hosts[role] = addr
    return hosts


def worker_configs(cfg: DilocoConfig, hosts: dict[str, str], port: int) -> list[DilocoConfig]:
    """Each worker's config: rank 0's address as the master (torch), each worker's own address for its DHT and
    p2p daemon (hivemind)."""
    out = []
    for role in roles(cfg.workers):
        upd: dict = {"master_addr": hosts["w0"], "master_port": port}
        if cfg.backend == "hivemind":
            upd["hivemind"] = cfg.hivemind.model_copy(update={"host": hosts[role]})
        out.append(cfg.model_copy(update=upd))
    return out


def _start(cfg: DilocoConfig, rank: int, world: int, ns: str) -> subprocess.Popen:
    out = Path(cfg.out)
    cfg_path = out / f"config.{rank}.json"
    cfg_path.write_text(cfg.model_dump_json(indent=2))
    env = child_env({**_env(cfg, rank, world, cfg.master_port or 0), "GLOO_SOCKET_IFNAME": LINK_DEV})
    with open(out / f"worker{rank}.stderr.log", "w") as err:
        return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "swarmrl.diloco.worker",
                                 "--config", str(cfg_path), "--rank", str(rank), "--world", str(world)],
                                env=env, stdout=err, stderr=subprocess.STDOUT, start_new_session=True)


def _kill_groups(procs: dict[int, subprocess.Popen]) -> None:
    """SIGKILL what is left of each worker's process group (hivemind's forked averager and p2p daemon)."""
    for p in procs.values():
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if p.poll() is None:
            p.wait()


def run_wan(cfg: DilocoConfig, profile: str, seed: int = 0, rtt_pings: int = 10,
            on_progress: Callable[[dict], None] | None = None) -> dict:
    """Run ``cfg.workers`` workers, each in its own namespace under network ``profile``; returns the run summary
    (also ``OUT/summary.json``). Needs root (``netns.WanUnavailable`` otherwise)."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("worker*.jsonl"), *out.glob("worker*.summary.json"), out / "hivemind_peers.json"]:
        old.unlink(missing_ok=True)
    names = roles(cfg.workers)
    with Harness.for_profile(profile, names, seed=seed, max_s=cfg.timeout_s + 600, log=out / "wire.log") as h:
        hosts = routable_hosts(h)
        rtt = (measure.rtt_ms(h, "w1", "w0", n=rtt_pings) if cfg.workers > 1 and rtt_pings > 0 else None)
        with netns.inside(h.netns["w0"]):
            port = cfg.master_port or free_port(hosts["w0"])
        t0 = time.perf_counter()
        procs: dict[int, subprocess.Popen] = {}
        try:
            for r, c in enumerate(worker_configs(cfg, hosts, port)):
                procs[r] = _start(c, r, cfg.workers, h.netns[names[r]])
            wait_all(procs, out, cfg.timeout_s, on_progress)
        finally:
            _kill_groups(procs)
        wall = time.perf_counter() - t0
        wan = {"profile": profile, "seed": seed, "roles": h.describe(), "hosts": hosts,
               "rtt_ms_w1_w0": {k: round(v, 2) for k, v in rtt.items()} if rtt else None}
    workers = [json.loads((out / f"worker{r}.summary.json").read_text()) for r in range(cfg.workers)]
    summary = {**summarize(cfg, workers, wall), **figures(workers), "wan": wan}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def figures(workers: list[dict]) -> dict:
    """Per-run figures from the workers' summaries: rank 0's compute utilization (the worker that evaluates over
    torch.distributed; its own evaluation is out of its figure, but the others wait for it at the next
    collective), every worker's, the loop's wall time, and each worker's TCP peers."""
    w0 = workers[0]
    return {"utilization": w0.get("utilization"), "utilization_per_worker": [w.get("utilization") for w in workers],
            "inner_s": w0.get("inner_s"), "eval_s": w0.get("eval_s"), "loop_s": w0.get("loop_s"),
            "steps_done": w0["steps"], "stopped_at_max_wall": w0.get("stopped_at_max_wall"),
            "solo_rounds": max(w.get("solo_rounds", 0) for w in workers),
            "tcp_peers": {str(w["rank"]): w.get("tcp_peers", []) for w in workers}}
