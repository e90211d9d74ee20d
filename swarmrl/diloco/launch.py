"""Start W DiLoCo worker processes on loopback and gather their results.

Each worker is a real subprocess (``python -m swarmrl.diloco.worker``) with torchrun-style
environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE). If any worker fails, the launcher stops
the others it started and raises with the failing worker's stderr tail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from swarmrl.diloco.config import DilocoConfig
from swarmrl.utils.metrics import read_metrics
from swarmrl.utils.procs import free_port


class WorkerFailed(RuntimeError):
    pass


def _env(cfg: DilocoConfig, rank: int, world: int, port: int) -> dict[str, str]:
    env = dict(os.environ)
    pkg_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(MASTER_ADDR=cfg.master_addr, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
               OMP_NUM_THREADS=str(cfg.threads), TOKENIZERS_PARALLELISM="false")
    return env


def start_worker(cfg: DilocoConfig, rank: int, world: int, port: int, tag: str | None = None) -> subprocess.Popen:
    """Start one worker subprocess with its own config file (``cfg`` may differ per worker)."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / f"config.{tag or rank}.json"
    cfg_path.write_text(cfg.model_dump_json(indent=2))
    err = open(out / f"worker{rank}.stderr.log", "w")
    return subprocess.Popen([sys.executable, "-m", "swarmrl.diloco.worker", "--config", str(cfg_path),
                             "--rank", str(rank), "--world", str(world)],
                            env=_env(cfg, rank, world, port), stdout=err, stderr=subprocess.STDOUT)


def stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def wait_all(procs: dict[int, subprocess.Popen], out: Path, timeout_s: float,
             on_progress: Callable[[dict], None] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    last_step = -1
    try:
        while True:
            codes = {r: p.poll() for r, p in procs.items()}
            bad = {r: c for r, c in codes.items() if c not in (None, 0)}
            if bad:
                r, c = next(iter(bad.items()))
                log = (out / f"worker{r}.stderr.log")
                tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
                raise WorkerFailed(f"worker {r} exited with status {c}:\n{tail}")
            if all(c == 0 for c in codes.values()):
                return
            if time.monotonic() > deadline:
                raise WorkerFailed(f"workers did not finish within {timeout_s:.0f}s")
            if on_progress:
                rows = [r for r in read_metrics(out / f"worker{min(procs)}.jsonl") if "step" in r and "final" not in r]
                if rows and rows[-1]["step"] != last_step:
                    last_step = rows[-1]["step"]
                    on_progress(rows[-1])
            time.sleep(0.5)
    finally:
        stop_all(list(procs.values()))


def run(cfg: DilocoConfig, on_progress: Callable[[dict], None] | None = None,
        hostile_entry: str | None = None) -> dict:
    """Run ``cfg.workers`` workers to completion; returns the run summary (also OUT/summary.json).
    ``hostile_entry`` (backend swarm with ``trust.adversary``): the hostile workers' module (``run_swarm``)."""
    if cfg.backend == "swarm":  # orchestrator + judging aggregator + workers (swarmrl.diloco.trust.launch)
        from swarmrl.diloco.trust.launch import SwarmFailed, run_swarm  # noqa: PLC0415  # lazy: the swarm backend only

        try:
            return run_swarm(cfg, on_progress, hostile_entry)
        except SwarmFailed as e:
            raise WorkerFailed(str(e)) from None
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("worker*.jsonl")) + list(out.glob("worker*.summary.json")) + [out / "hivemind_peers.json"]:
        old.unlink(missing_ok=True)
    port = cfg.master_port or free_port(cfg.master_addr)
    t0 = time.perf_counter()
    procs = {r: start_worker(cfg, r, cfg.workers, port) for r in range(cfg.workers)}
    wait_all(procs, out, cfg.timeout_s, on_progress)
    workers = [json.loads((out / f"worker{r}.summary.json").read_text()) for r in range(cfg.workers)]
    summary = summarize(cfg, workers, time.perf_counter() - t0)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def summarize(cfg: DilocoConfig, workers: list[dict], wall_s: float) -> dict:
    w0 = workers[0]
    return {
        "mode": cfg.mode, "backend": cfg.backend, "wire": cfg.wire, "workers": cfg.workers,
        "total_steps": cfg.total_steps, "inner_steps": cfg.inner_steps if cfg.mode == "diloco" else 1,
        "params": w0["params"], "tokens_per_worker": w0["tokens"], "data": w0.get("data"),
        "final_eval_loss": w0["final_eval_loss"], "final_answer_loss": w0.get("final_answer_loss"),
        "final_eval_seq_losses": w0.get("final_eval_seq_losses"),
        "bytes_sent_per_worker": max(w["bytes_sent"] for w in workers),
        # measured by the kernel on each worker's TCP connections (None where it cannot be read)
        "tcp_bytes_sent_per_worker": _max_or_none(w.get("tcp_bytes_sent") for w in workers),
        "tcp_bytes_received_per_worker": _max_or_none(w.get("tcp_bytes_received") for w in workers),
        "tcp_setup_bytes_sent_per_worker": _max_or_none(w.get("tcp_setup_bytes_sent") for w in workers),
        "sync_calls_per_worker": w0["sync_calls"],
        "bytes_per_sync": (w0["bytes_sent"] // w0["sync_calls"]) if w0["sync_calls"] else 0,
        "identical_params": len({w["digest"] for w in workers}) == 1,
        # overlap_steps = "auto": the tau each worker settled on (0: blocking) and rank 0's timing behind it
        "overlap_steps_per_worker": [w.get("overlap_steps", 0) for w in workers],
        "overlap_decision": w0.get("overlap_decision"),
        "evals": w0["evals"], "wall_s": round(wall_s, 1), "train_s": w0["train_s"], "sync_s": w0["sync_s"],
        "out": cfg.out,
    }


def _max_or_none(values) -> int | None:
    vals = list(values)
    return None if any(v is None for v in vals) else max(vals)
