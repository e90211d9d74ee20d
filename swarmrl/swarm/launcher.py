"""``swarmrl run`` in swarm mode (the main job): the async RL loop with untrusted nodes, all real processes
on 127.0.0.1.

Processes: the orchestrator (SQLite under the run dir, a free port), the GRPO trainer (unchanged; with
``rl.shardcast.enabled`` it is the SHARDCAST origin) with its adapter (step and weight-server
announcements, accepted files into the run dir), ``rl.shardcast.relays`` relays under the origin (nodes
learn their URLs and the manifest key from heartbeat replies), a validator (policy model of each
version from the run dir), N honest nodes and one node per ``--adversary`` (each with its own key).
The orchestrator, relays, validator, adapter and honest nodes are restarted if they die (the
orchestrator and relays on the same port, the orchestrator on the same database, so nothing is lost);
ejected adversaries are not. The summary adds
per-node submission counts, verdict reasons and stakes.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

import httpx

from swarmrl.config import dump_config
from swarmrl.rl.store import RunDir
from swarmrl.utils.metrics import read_metrics
from swarmrl.utils.procs import free_port, stop_process


def _keygen(path: Path) -> dict:
    from swarmrl.protocol.signing import generate_key, node_id_for, public_key_hex, save_private_key

    key = generate_key()
    save_private_key(key, path)
    pub = public_key_hex(key)
    return {"key": str(path), "public_key": pub, "node_id": node_id_for(pub)}


def launch_swarm(cfg, progress: Callable[[str], None] = print,  # noqa: ANN001, C901
                 live: Callable[[dict], None] | None = None) -> dict:
    from swarmrl.protocol.client import wait_until_up
    from swarmrl.protocol.config import OrchestratorConfig, ValidatorConfig
    from swarmrl.rl.launcher import _spawn, finish, forget_origin, prepare_warmstart, relay_specs, wait_for_origin

    sw = cfg.swarm
    prepare_warmstart(cfg, progress)
    rl = cfg.rl
    if rl.keep_versions < rl.async_level + 4:  # the validator may lag: keep the versions it still checks
        rl = rl.model_copy(update={"keep_versions": rl.async_level + 4})
    if sw.proofs and not rl.workers.proofs:  # honest nodes attach TOPLOC proofs; the validator checks them
        rl = rl.model_copy(update={"workers": rl.workers.model_copy(update={"proofs": True})})
    cfg = cfg.model_copy(update={"rl": rl})
    root = Path(rl.run_dir)
    if cfg.fresh and root.exists():
        shutil.rmtree(root)
    RunDir(root)
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    keys_dir = root / "keys"
    keys_dir.mkdir(exist_ok=True)
    rl_path = root / "rl.toml"
    rl_path.write_text(dump_config(rl))

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    secret = secrets.token_hex(16)
    val_key = _keygen(keys_dir / "validator.pem")
    tr_key = _keygen(keys_dir / "trainer.pem")
    members: dict[str, dict] = {}
    for i in range(sw.nodes):
        members[f"n{i}"] = {**_keygen(keys_dir / f"n{i}.pem"), "adversary": ""}
    for i, kind in enumerate(sw.adversaries):
        members[f"x{i}-{kind}"] = {**_keygen(keys_dir / f"x{i}.pem"), "adversary": kind}
    tasks_per_node = sw.tasks_per_node or rl.workers.prompts_per_batch
    ocfg = OrchestratorConfig(
        port=port, data_dir=str(root / "orchestrator"), run_secret=secret,
        validator_keys=[val_key["public_key"]], trainer_keys=[tr_key["public_key"]],
        heartbeat_interval_s=sw.heartbeat_interval_s, dead_after_missed=sw.dead_after_missed, sweep_interval_s=0.5,
        rate_limit_per_s=200.0, rate_limit_burst=400, min_stake=min(100.0, sw.stake),
        task=rl.task, tasks_per_node=tasks_per_node, group_size=rl.group_size, async_window=rl.async_level,
        budget_tiers=sorted(rl.budget.targets) if rl.budget.enabled else [],
        target_step_time_s=rl.budget.max_batch_seconds, budget_prompt_format=rl.budget.prompt_format,
        budget_penalty=rl.budget.penalty, groups_per_step=rl.prompts_per_step,
        overassign=sw.overassign, lookahead=rl.async_level, count_tied_groups=not rl.filter_ties,
        last_step=rl.steps - 1, max_upload_bytes=sw.max_upload_bytes, optimistic=sw.optimistic,
        assignment_timeout_s=sw.assignment_timeout_s,
        metrics_interval_s=1.0)
    opath = root / "orchestrator.toml"
    opath.write_text(dump_config(ocfg))
    vcfg = ValidatorConfig(orchestrator=url, key=val_key["key"], model_dir=rl.model,
                           model_dir_template=str(root / "policy" / "v{policy_version:06d}"), run_secret=secret,
                           poll_interval_s=sw.validator_poll_s, work_dir=str(root / "validator"),
                           logprob_rows=sw.logprob_rows, require_proofs=sw.require_proofs,
                           sampling_thresholds={"min_token_logprob": sw.min_token_logprob},
                           reject_late_steps=False, threads=sw.validator_threads)
    vpath = root / "validator.toml"
    vpath.write_text(dump_config(vcfg))
    (root / "swarm.json").write_text(json.dumps({"orchestrator": url, "members": members}, indent=2))

    def orch_args() -> list[str]:
        return ["orchestrator", "serve", "--config", str(opath)]

    def node_args(name: str) -> list[str]:
        m = members[name]
        a = ["node", "run", "--orchestrator", url, "--key", m["key"], "--rl-config", str(rl_path),
             "--set", f"stake={sw.stake}", "--set", f"threads={sw.node_threads}"]
        if m["adversary"]:
            a += ["--adversary", m["adversary"], "--set", f"oversize_bytes={sw.max_upload_bytes + 1}"]
        return a

    specs: dict[str, list[str]] = {
        "trainer": ["rl", "trainer", "--config", str(rl_path)],
        "adapter": ["rl", "adapter", "--config", str(rl_path), "--orchestrator", url, "--key", tr_key["key"]],
        "validator": ["validator", "run", "--config", str(vpath)],
        **{name: node_args(name) for name in members},
    }
    t0 = time.monotonic()
    procs: dict[str, subprocess.Popen] = {}
    procs["orchestrator"] = _spawn(orch_args(), logs / "orchestrator.log")
    try:
        wait_until_up(url, procs["orchestrator"])
    except BaseException:
        stop_process(procs["orchestrator"])
        raise
    progress(f"orchestrator on {url}; {sw.nodes} honest nodes, adversaries: {', '.join(sw.adversaries) or 'none'}")
    forget_origin(RunDir(root))
    procs["trainer"] = _spawn(specs["trainer"], logs / "trainer.log")
    if rl.shardcast.enabled:  # the trainer is the SHARDCAST origin; relays under it serve the nodes
        try:
            origin = wait_for_origin(RunDir(root), procs["trainer"], logs)
        except BaseException:
            for p in procs.values():
                stop_process(p)
            raise
        relays, relay_urls = relay_specs(rl.shardcast.relays, RunDir(root), origin)
        specs.update(relays)
        RunDir(root).write_json("relays.json", relay_urls)
        progress(f"SHARDCAST: origin {origin['url']}, relays {', '.join(relay_urls) or 'none'} "
                 "(announced to nodes in heartbeats)")
    for name, args in specs.items():
        if name not in procs:
            procs[name] = _spawn(args, logs / f"{name}.log")

    def write_pids() -> None:
        tmp = root / ".pids.json.tmp"
        tmp.write_text(json.dumps({k: p.pid for k, p in procs.items()}))
        os.replace(tmp, root / "pids.json")

    write_pids()
    import threading

    if threading.current_thread() is threading.main_thread():  # SIGTERM: still stop every child (finally below)
        def _term(_sig, _frame):  # noqa: ANN001, ANN202
            raise SystemExit(143)
        signal.signal(signal.SIGTERM, _term)
    restarts: dict[str, int] = {}
    run = RunDir(root)
    try:
        while procs["trainer"].poll() is None:
            for name, p in list(procs.items()):
                if name == "trainer" or p.poll() is None or run.is_done():
                    continue
                if name in members and (members[name]["adversary"] or p.returncode == 3):
                    continue  # ejected / refused nodes stay out
                if name in members and p.returncode < 0:
                    continue  # a node killed from outside is gone: its work gets reassigned
                restarts[name] = restarts.get(name, 0) + 1
                if restarts[name] > sw.max_restarts:
                    raise RuntimeError(f"{name} keeps failing; see {logs / (name + '.log')}")
                progress(f"{name} exited with {p.returncode}; restarting it")
                if name == "orchestrator":
                    procs[name] = _spawn(orch_args(), logs / "orchestrator.log")
                    wait_until_up(url, procs[name])
                else:
                    procs[name] = _spawn(specs[name], logs / f"{name}.log")
                write_pids()
            if live is not None:
                live(swarm_snapshot(root, t0))
            time.sleep(1.0)
        if procs["trainer"].returncode != 0:
            raise RuntimeError(f"trainer failed with exit code {procs['trainer'].returncode}; see {logs / 'trainer.log'}")
        swarm = swarm_report(root, url, members)
    finally:
        run.done_flag.touch()
        for name, p in procs.items():
            if name != "orchestrator":
                stop_process(p, term_s=3.0 if name in members else 1.0)
        stop_process(procs["orchestrator"])
    if live is not None:
        live(swarm_snapshot(root, t0))
    summary = finish(cfg, root, time.monotonic() - t0)
    summary.update(mode="swarm", swarm=swarm)
    (root / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def orchestrator_counts(root: Path) -> dict:
    rows = [r for r in read_metrics(root / "orchestrator" / "metrics.jsonl") if r.get("event") == "snapshot"]
    last = rows[-1] if rows else {}
    return {"accepted": last.get("submissions_accepted", 0), "rejected": last.get("submissions_rejected", 0),
            "pending": last.get("submissions_pending", 0), "slashed_nodes": last.get("nodes_ejected", 0),
            "active_nodes": last.get("nodes_active", 0), "refused_requests": last.get("refused", 0)}


def swarm_snapshot(root: Path, t0: float) -> dict:
    from swarmrl.rl.launcher import snapshot

    s = snapshot(root, t0)
    tps = []
    for f in sorted((root / "metrics").glob("node-*.jsonl")):
        w = [r for r in read_metrics(f) if "tokens_per_s" in r]
        if w:
            tps.append(sum(r["tokens_per_s"] for r in w[-5:]) / len(w[-5:]))
    s["tokens_per_s"] = sum(tps) if tps else None
    s.update(orchestrator_counts(root))
    return s


def swarm_report(root: Path, url: str, members: dict[str, dict]) -> dict:
    """Per node: adversary kind, status and stake from the ledger, submissions by verdict, reasons, refusals."""
    verdicts = [r for r in read_metrics(root / "orchestrator" / "metrics.jsonl") if r.get("event") == "verdict"]
    out: dict[str, dict] = {}
    for name, m in members.items():
        nid = m["node_id"]
        mine = [v for v in verdicts if v.get("node_id") == nid]
        node_rows = read_metrics(root / "metrics" / f"node-{nid}.jsonl")
        refused = [r for r in node_rows if r.get("submitted") is False]
        info = {"node_id": nid, "adversary": m["adversary"] or None,
                "accepted": sum(v["status"] == "accepted" for v in mine),
                "rejected": sum(v["status"] == "rejected" for v in mine),
                "reject_reasons": sorted({v["reason"][:200] for v in mine if v["status"] == "rejected"}),
                "refused_uploads": len(refused),
                "refusals": sorted({f"{r.get('refused_status')}: {r.get('refused', '')[:120]}" for r in refused})[:3],
                "slashed": sum(v.get("slashed", 0.0) for v in mine)}
        try:
            b = httpx.get(f"{url}/v1/nodes/{nid}/ledger", timeout=5.0)
            if b.status_code == 200:
                j = b.json()
                info.update(status=j["status"], stake=j["stake"], credits_locked=j["credits_locked"])
            else:
                info.update(status="unregistered")
        except httpx.HTTPError:
            info.update(status="unknown")
        out[name] = info
    return {"orchestrator": url, "totals": orchestrator_counts(root), "nodes": out}
