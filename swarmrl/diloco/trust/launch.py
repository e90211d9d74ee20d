"""DiLoCo trusting no one, on loopback: a real orchestrator process, the aggregator process and W worker processes.

``run_swarm(cfg)`` (``swarmrl diloco --backend swarm``; ``swarmrl.diloco.launch.run`` hands ``backend = "swarm"``
here) makes the keys (``OUT/keys``: the aggregator's, a stake authority's, one per worker), starts

1. the orchestrator (``python -m swarmrl orchestrator serve``; SQLite under ``OUT/orchestrator``) with the
   aggregator's public key as its validator and the authority's as its stake authority, ``min_stake`` the
   workers' stake; the authority deposits every worker's stake before the workers start (the real deposit path);
2. the aggregator (``python -m swarmrl.diloco.trust.aggregator``), once the orchestrator answers;
3. the workers (``python -m swarmrl.diloco.worker``) at the same time as the aggregator (both take seconds to
   build the model and the corpus); each registers, waits for the aggregator to answer, joins and downloads the
   aggregator's state itself (``trust.client.SwarmAverager``).

Every process is started in a session of its own with ``child_env`` (it dies with this one, ``procs``) and is
stopped when the run ends. A worker that exits with ``EJECTED_EXIT`` was ejected (its stake slashed): that ends
its part, not the run. The summary adds, per worker, its node id, its status and the stake slashed (read from the
orchestrator's ledger, ``GET /v1/nodes/{id}/ledger``), and the rounds in which the aggregator accepted or rejected
its upload (read from the published results).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from swarmrl.config import dump_config
from swarmrl.diloco.config import DilocoConfig
from swarmrl.diloco.trust.client import EJECTED_EXIT
from swarmrl.protocol.client import AuthorityClient, wait_until_up
from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.signing import generate_key, load_private_key, node_id_for, public_key_hex, save_private_key
from swarmrl.utils.metrics import read_metrics
from swarmrl.utils.procs import child_env, free_port, stop_process

__all__ = ["SwarmFailed", "run_swarm", "orchestrator_config"]

HOST = "127.0.0.1"
AGGREGATOR_START_S = 120.0  # the aggregator must answer within this (a worker waits as long: client.CONNECT_S)


class SwarmFailed(RuntimeError):
    pass


@dataclass
class _Key:
    path: Path
    public_key: str

    @property
    def node_id(self) -> str:
        return node_id_for(self.public_key)


def _key(path: Path) -> _Key:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        save_private_key(generate_key(), path)
    return _Key(path, public_key_hex(load_private_key(path)))


def _env(cfg: DilocoConfig) -> dict[str, str]:
    env = dict(os.environ)
    pkg_root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(OMP_NUM_THREADS=str(cfg.threads), TOKENIZERS_PARALLELISM="false")
    return child_env(env)


def orchestrator_config(cfg: DilocoConfig, port: int, aggregator: _Key, authority: _Key) -> OrchestratorConfig:
    """The orchestrator of a loopback run: the aggregator is its validator, ``authority`` deposits the stake."""
    return OrchestratorConfig(host=HOST, port=port, data_dir=str(Path(cfg.out) / "orchestrator"),
                              validator_keys=[aggregator.public_key], stake_authority_keys=[authority.public_key],
                              min_stake=cfg.trust.stake, heartbeat_interval_s=5.0, dead_after_missed=6,
                              metrics_interval_s=60.0, rollouts=False)


@dataclass
class _Procs:
    """What this launcher started, stopped in reverse order."""

    out: Path
    started: list[tuple[str, subprocess.Popen]] = field(default_factory=list)

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.out / f"{name}.stderr.log", "w")  # noqa: SIM115  # the child holds it
        try:
            p = subprocess.Popen([sys.executable, *argv], env=env, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        finally:
            log.close()
        self.started.append((name, p))
        pids = self.out / "pids.json"  # what this launcher started (operators, and the test that kills it)
        pids.write_text(json.dumps({n: q.pid for n, q in self.started}))
        return p

    def tail(self, name: str, n: int = 3000) -> str:
        log = self.out / f"{name}.stderr.log"
        return log.read_text(errors="replace")[-n:] if log.exists() else ""

    def stop(self) -> None:
        for _, p in reversed(self.started):
            stop_process(p, term_s=5.0)


def _wait_http(url: str, proc: subprocess.Popen, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SwarmFailed(f"the {what} exited with status {proc.returncode} while starting")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SwarmFailed(f"the {what} did not answer {url} within {timeout:.0f}s")


def _wait_workers(procs: _Procs, workers: dict[int, subprocess.Popen], out: Path, deadline: float,
                  others: list[tuple[str, subprocess.Popen]],
                  on_progress: Callable[[dict], None] | None) -> dict[int, int]:
    """Wait until every worker has exited; returns their exit codes. A worker exiting other than 0 or
    ``EJECTED_EXIT``, or the orchestrator or aggregator exiting, fails the run."""
    last_step = -1
    while True:
        codes = {r: p.poll() for r, p in workers.items()}
        bad = {r: c for r, c in codes.items() if c not in (None, 0, EJECTED_EXIT)}
        if bad:
            r, c = next(iter(bad.items()))
            raise SwarmFailed(f"worker {r} exited with status {c}:\n{procs.tail(f'worker{r}')}")
        if all(c is not None for c in codes.values()):
            return codes  # type: ignore[return-value]
        for name, p in others:
            if p.poll() is not None:
                raise SwarmFailed(f"the {name} exited with status {p.returncode}:\n{procs.tail(name)}")
        if time.monotonic() > deadline:
            raise SwarmFailed("workers did not finish within the run's timeout_s")
        if on_progress:
            first = min(r for r, c in codes.items() if c is None)
            rows = [row for row in read_metrics(out / f"worker{first}.jsonl") if "step" in row and "final" not in row]
            if rows and rows[-1]["step"] != last_step:
                last_step = rows[-1]["step"]
                on_progress(rows[-1])
        time.sleep(0.5)


def run_swarm(cfg: DilocoConfig, on_progress: Callable[[dict], None] | None = None,
              hostile_entry: str | None = None) -> dict:
    """Run orchestrator, aggregator and ``cfg.workers`` workers on loopback to the end; returns the run summary
    (also ``OUT/summary.json``). ``hostile_entry``: the module the ranks in ``trust.adversary_ranks`` run as when
    ``trust.adversary`` is set (``swarmrl.attacks.diloco``, named by the caller: no honest role imports the attack
    tools)."""
    if cfg.backend != "swarm":
        raise ValueError("run_swarm needs backend 'swarm'")
    hostile_ranks = set(cfg.trust.adversary_ranks) if cfg.trust.adversary != "none" else set()
    if hostile_ranks and not hostile_entry:
        raise ValueError(f"trust.adversary = {cfg.trust.adversary!r} needs the hostile workers' entry module "
                         "(hostile_entry: swarmrl diloco and the attack benchmark pass it)")
    out = Path(cfg.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    round_log = out / "aggregator.rounds.jsonl"  # the aggregator's own log of every round
    for old in [*out.glob("worker*.jsonl"), *out.glob("worker*.summary.json"), round_log, out / "summary.json"]:
        old.unlink(missing_ok=True)
    orch_dir = out / "orchestrator"
    for old in orch_dir.glob("orchestrator.db*") if orch_dir.exists() else []:
        old.unlink()  # a fresh ledger per run
    cfg = cfg.model_copy(update={"out": str(out)})
    keys = out / "keys"
    aggregator, authority = _key(keys / "aggregator.pem"), _key(keys / "authority.pem")
    workers = {r: _key(keys / f"worker{r}.pem") for r in range(cfg.workers)}
    oport, aport = free_port(HOST), free_port(HOST)
    ocfg = orchestrator_config(cfg, oport, aggregator, authority)
    ourl, aurl = f"http://{HOST}:{oport}", f"http://{HOST}:{aport}"
    (out / "orchestrator.toml").write_text(dump_config(ocfg))
    env = _env(cfg)
    procs = _Procs(out)
    t0 = time.perf_counter()
    deadline = time.monotonic() + cfg.timeout_s
    try:
        orch = procs.start("orchestrator", ["-m", "swarmrl", "orchestrator", "serve", "--config",
                                            str(out / "orchestrator.toml")], env)
        try:
            wait_until_up(ourl, orch, timeout=60.0)
        except RuntimeError as e:
            raise SwarmFailed(f"{e}:\n{procs.tail('orchestrator')}") from None
        with AuthorityClient(ourl, authority.path) as auth:
            for k in workers.values():
                auth.deposit(cfg.trust.stake, public_key=k.public_key, note="diloco worker stake")
        trust = cfg.trust.model_copy(update={"orchestrator_url": ourl, "aggregator_url": aurl})
        acfg_path = out / "aggregator.config.json"
        acfg_path.write_text(cfg.model_copy(update={"trust": trust}).model_dump_json(indent=2))
        agg = procs.start("aggregator", ["-m", "swarmrl.diloco.trust.aggregator", "--config", str(acfg_path),
                                         "--key", str(aggregator.path), "--orchestrator", ourl,
                                         "--port", str(aport), "--log", str(round_log)],
                          env)
        wprocs: dict[int, subprocess.Popen] = {}
        for r, k in workers.items():  # they start while the aggregator does (each waits for it to answer)
            wcfg = cfg.model_copy(update={"trust": trust.model_copy(update={"key": str(k.path)})})
            path = out / f"config.{r}.json"
            path.write_text(wcfg.model_dump_json(indent=2))
            module = hostile_entry if r in hostile_ranks else "swarmrl.diloco.worker"
            wprocs[r] = procs.start(f"worker{r}", ["-m", module, "--config", str(path), "--rank", str(r),
                                                   "--world", str(cfg.workers)], env)
        try:
            _wait_http(f"{aurl}/v1/diloco/run", agg, "aggregator", AGGREGATOR_START_S)
        except SwarmFailed as e:
            raise SwarmFailed(f"{e}:\n{procs.tail('aggregator')}") from None
        codes = _wait_workers(procs, wprocs, out, deadline, [("orchestrator", orch), ("aggregator", agg)],
                              on_progress)
        members = _members(cfg, ourl, aurl, workers, codes, round_log)
    finally:
        procs.stop()
    summary = summarize_swarm(cfg, out, members, time.perf_counter() - t0)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _members(cfg: DilocoConfig, ourl: str, aurl: str, keys: dict[int, _Key], codes: dict[int, int],
             round_log: Path) -> list[dict]:
    """Per worker: node id, exit, ledger status and slashes, and the rounds the aggregator accepted or rejected:
    from the aggregator's own log of every round (``round_log``, which this launcher's aggregator writes), else from
    the results it still serves over HTTP (the last ``KEEP_RESULTS``: a 100-round run lost its first rejections)."""
    from swarmrl.diloco.trust.client import read_round_log  # noqa: PLC0415  # one module, imported once here

    rounds = read_metrics(round_log) if round_log.exists() else read_round_log(aurl, timeout=30.0)
    members = []
    with httpx.Client(base_url=ourl, timeout=30.0) as http:
        for r, k in keys.items():
            bal = http.get(f"/v1/nodes/{k.node_id}/ledger")
            bal.raise_for_status()
            b = bal.json()
            slashes = [e for e in b["entries"] if e["kind"] == "slash"]
            accepted = [row["round"] for row in rounds if k.node_id in row["accepted"]]
            rejected = [{"round": row["round"], "reason": rej.get("reason", "")} for row in rounds
                        for rej in row["rejected"] if rej.get("node_id") == k.node_id]
            members.append({
                "rank": r, "node_id": k.node_id, "exit": codes.get(r), "ejected_exit": codes.get(r) == EJECTED_EXIT,
                "adversary": cfg.trust.adversary if r in cfg.trust.adversary_ranks else "none",
                "status": b["status"], "stake": b["stake"],
                "slashed": round(sum(abs(e["amount"]) for e in slashes), 6),
                "slash_notes": [e.get("note") for e in slashes],
                "rounds_accepted": len(accepted), "rounds_rejected": rejected,
                "first_rejected_round": rejected[0]["round"] if rejected else None,
            })
    return members


def summarize_swarm(cfg: DilocoConfig, out: Path, members: list[dict], wall_s: float) -> dict:
    """The run summary: the finished workers' figures (the evaluating one: the lowest rank that finished) and the
    members' standing."""
    done = {m["rank"]: json.loads((out / f"worker{m['rank']}.summary.json").read_text())
            for m in members if (out / f"worker{m['rank']}.summary.json").exists()}
    if not done:
        raise SwarmFailed("no worker finished the run")
    honest = [r for r in done if r not in cfg.trust.adversary_ranks]
    w0 = done[min(done)]
    for m in members:
        s = done.get(m["rank"])
        m["bytes_sent"] = s["bytes_sent"] if s else None
        m["digest"] = s["digest"] if s else None
        m["final_eval_loss"] = s["final_eval_loss"] if s else None
    return {
        "mode": cfg.mode, "backend": cfg.backend, "wire": cfg.wire, "workers": cfg.workers,
        "aggregate": cfg.trust.aggregate, "adversary": cfg.trust.adversary,
        "adversary_ranks": list(cfg.trust.adversary_ranks),
        "total_steps": cfg.total_steps, "inner_steps": cfg.inner_steps, "params": w0["params"],
        "tokens_per_worker": w0["tokens"], "data": w0.get("data"), "final_eval_loss": w0["final_eval_loss"],
        "final_answer_loss": w0.get("final_answer_loss"),
        "bytes_sent_per_worker": max(s["bytes_sent"] for s in done.values()),
        "sync_calls_per_worker": w0["sync_calls"],
        "bytes_per_sync": (w0["bytes_sent"] // w0["sync_calls"]) if w0["sync_calls"] else 0,
        "identical_params": len({s["digest"] for s in done.values()}) == 1,
        "honest_identical_params": len({done[r]["digest"] for r in honest}) <= 1,
        "finished": sorted(done), "members": members,
        "slashed": [m["rank"] for m in members if m["slashed"] > 0],
        "ejected": [m["rank"] for m in members if m["status"] == "ejected"],
        "evals": w0["evals"], "wall_s": round(wall_s, 1), "train_s": w0["train_s"], "sync_s": w0["sync_s"],
        "out": cfg.out,
    }
