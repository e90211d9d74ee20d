"""`swarmrl run` for the async RL loop: warm start if needed, then a trainer and N worker processes.

The launcher only starts, watches and restarts processes and reads their metrics files; trainer
and workers talk through the run directory (see ``swarmrl.rl.store``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Literal

from pydantic import Field

from swarmrl.config import StrictModel, dump_config
from swarmrl.rl.config import RLConfig
from swarmrl.rl.store import RunDir
from swarmrl.sft.config import SFTConfig
from swarmrl.swarm.config import SwarmSection
from swarmrl.utils.metrics import read_metrics
from swarmrl.utils.procs import free_port, stop_process


class WarmstartSection(StrictModel):
    enabled: bool = True
    reuse: bool = True  # skip if the warm-start model already exists
    sft: SFTConfig = Field(default_factory=lambda: SFTConfig(out="runs/warmstart", minutes=2.0, eval_at_minutes=[]))


class RunConfig(StrictModel):
    mode: Literal["local", "swarm"] = "local"  # swarm: untrusted nodes behind an orchestrator and validator
    rl: RLConfig = Field(default_factory=RLConfig)
    swarm: SwarmSection = Field(default_factory=SwarmSection)
    warmstart: WarmstartSection = Field(default_factory=WarmstartSection)
    fresh: bool = True  # delete an existing run_dir first (False: resume it)
    max_worker_restarts: int = Field(5, ge=0)
    final_eval_n: int = Field(512, ge=1)


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    f = open(log, "ab")
    return subprocess.Popen([sys.executable, "-m", "swarmrl", *args], stdout=f, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def prepare_warmstart(cfg: RunConfig, progress: Callable[[str], None]) -> str:
    model = Path(cfg.rl.model)
    if (model / "config.json").is_file() and cfg.warmstart.reuse:
        progress(f"warm start: reusing {model}")
        return str(model)
    if not cfg.warmstart.enabled:
        raise FileNotFoundError(f"initial model {model} does not exist and warm start is disabled")
    from swarmrl.sft.train import run_sft

    sft = cfg.warmstart.sft.model_copy(update={"task": cfg.rl.task})
    progress(f"warm start: SFT of a fresh tiny model on {sft.task.name} for {sft.minutes} min")

    def cb(row: dict) -> None:
        if row["step"] % 100 == 0:
            progress(f"  sft step {row['step']}  loss {row['loss']:.3f}")

    summary = run_sft(sft, cb)
    src = Path(summary["model"])
    if src.resolve() != model.resolve():
        if model.exists():
            shutil.rmtree(model)
        model.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, model)
    progress(f"warm start: held-out accuracy {summary['final_heldout_acc']:.3f} after {summary['steps']} steps")
    return str(model)


def launch(cfg: RunConfig, progress: Callable[[str], None] = print, live: Callable[[dict], None] | None = None) -> dict:
    """Run the whole job; returns a summary dict."""
    if cfg.mode == "swarm":
        from swarmrl.swarm.launcher import launch_swarm

        return launch_swarm(cfg, progress, live)
    prepare_warmstart(cfg, progress)
    root = Path(cfg.rl.run_dir)
    if cfg.fresh and root.exists():
        shutil.rmtree(root)
    run = RunDir(root)
    cfg_path = root / "rl.toml"
    cfg_path.write_text(dump_config(cfg.rl))
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    t0 = time.monotonic()
    forget_origin(run)
    trainer = _spawn(["rl", "trainer", "--config", str(cfg_path)], logs / "trainer.log")
    relays = start_relays(cfg, run, trainer, logs) if cfg.rl.shardcast.enabled else []
    workers = {f"w{i}": _spawn(["rl", "worker", "--config", str(cfg_path), "--id", f"w{i}"], logs / f"w{i}.log")
               for i in range(cfg.rl.workers.num)}
    restarts = 0
    try:
        while trainer.poll() is None:
            for wid, p in list(workers.items()):
                if p.poll() is not None and not run.is_done():
                    if restarts >= cfg.max_worker_restarts:
                        raise RuntimeError(f"worker {wid} keeps failing; see {logs / (wid + '.log')}")
                    restarts += 1
                    progress(f"worker {wid} exited with {p.returncode}; restarting it")
                    workers[wid] = _spawn(["rl", "worker", "--config", str(cfg_path), "--id", wid],
                                          logs / f"{wid}.log")
            if live is not None:
                live(snapshot(root, t0))
            time.sleep(1.0)
        if trainer.returncode != 0:
            raise RuntimeError(f"trainer failed with exit code {trainer.returncode}; see {logs / 'trainer.log'}")
    finally:
        if trainer.poll() is None:
            trainer.terminate()
        run.done_flag.touch()
        for p in workers.values():
            stop_process(p, wait_s=10.0)
        for p in relays:
            stop_process(p)
    if live is not None:
        live(snapshot(root, t0))
    return finish(cfg, root, time.monotonic() - t0)


def forget_origin(run: RunDir) -> None:
    """Before (re)starting a trainer: a resumed run's ``origin.json`` names the previous trainer's port."""
    (run.shardcast / "origin.json").unlink(missing_ok=True)


def wait_for_origin(run: RunDir, trainer: subprocess.Popen, logs: Path, timeout_s: float = 180.0) -> dict:
    """The trainer's SHARDCAST origin (``origin.json``: url, public_key), once it is up."""
    t0 = time.monotonic()
    while True:
        origin = run.read_json("origin.json")
        if isinstance(origin, dict):
            return origin
        if trainer.poll() is not None:
            raise RuntimeError(f"trainer exited with {trainer.returncode} before its SHARDCAST origin came up; "
                               f"see {logs / 'trainer.log'}")
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError("the trainer's SHARDCAST origin did not come up")
        time.sleep(0.2)


def relay_specs(n: int, run: RunDir, origin: dict) -> tuple[dict[str, list[str]], list[str]]:
    """CLI arguments of ``n`` relay processes under the origin (each on its own free port), and their URLs."""
    specs, urls = {}, []
    for i in range(n):
        port = free_port()
        specs[f"relay{i}"] = ["shardcast", "relay", "--upstream", origin["url"], "--dir", str(run.shardcast / f"relay{i}"),
                              "--port", str(port), "--origin-pubkey", origin["public_key"]]
        urls.append(f"http://127.0.0.1:{port}")
    return specs, urls


def start_relays(cfg: RunConfig, run: RunDir, trainer: subprocess.Popen, logs: Path,
                 timeout_s: float = 180.0) -> list[subprocess.Popen]:
    """Wait for the trainer's SHARDCAST origin, start the relay processes, announce their URLs."""
    origin = wait_for_origin(run, trainer, logs, timeout_s)
    specs, urls = relay_specs(cfg.rl.shardcast.relays, run, origin)
    procs = [_spawn(args, logs / f"{name}.log") for name, args in specs.items()]
    run.write_json("relays.json", urls)
    return procs


def snapshot(root: Path, t0: float) -> dict:
    rows = read_metrics(root / "metrics" / "trainer.jsonl")
    steps = [r for r in rows if "reward" in r]
    evals = [r for r in rows if "heldout_acc" in r]
    tps = []
    for f in sorted((root / "metrics").glob("worker-*.jsonl")):
        w = [r for r in read_metrics(f) if "tokens_per_s" in r]
        if w:
            tps.append(sum(r["tokens_per_s"] for r in w[-5:]) / len(w[-5:]))
    last = steps[-1] if steps else {}
    return {"elapsed_s": time.monotonic() - t0, "step": last.get("step", -1) + 1 if last else 0,
            "reward": last.get("task_reward"), "lag": last.get("lag_mean"),
            "heldout_acc": evals[-1]["heldout_acc"] if evals else None,
            "first_acc": evals[0]["heldout_acc"] if evals else None,
            "tokens_per_s": sum(tps) if tps else None, "wait_frac": (sum(r["wait_s"] for r in steps) /
                                                                     max(1e-9, steps[-1]["wall_s"])) if steps else None}


def finish(cfg: RunConfig, root: Path, wall_s: float) -> dict:
    from swarmrl.rl.plot import plot_run

    run = RunDir(root)
    latest = run.latest_version()
    final_dir = root / "final_model"
    if final_dir.exists():
        shutil.rmtree(final_dir)
    shutil.copytree(run.version_dir(latest), final_dir, ignore=shutil.ignore_patterns("trainer_state.pt"))
    png = plot_run(root)
    rows = read_metrics(root / "metrics" / "trainer.jsonl")
    evals = [r for r in rows if "heldout_acc" in r]
    steps = {r["step"]: r for r in rows if "reward" in r}
    from swarmrl.eval.heldout import EvalConfig, evaluate_path

    ev = EvalConfig(model=str(final_dir), task=cfg.rl.task, n=cfg.final_eval_n,
                    max_new_tokens=cfg.rl.eval.max_new_tokens, chat_template=cfg.rl.chat_template)
    final = evaluate_path(ev)
    init = evaluate_path(ev.model_copy(update={"model": cfg.rl.model}))
    summary = {
        "run_dir": str(root), "final_model": str(final_dir), "curves": str(png), "steps": len(steps),
        "wall_s": round(wall_s, 1), "heldout_acc_initial": init["accuracy"], "heldout_acc_final": final["accuracy"],
        "heldout_n": final["n"], "async_level": cfg.rl.async_level, "workers": cfg.rl.workers.num,
        "trainer_wait_frac": round(sum(r["wait_s"] for r in steps.values()) / max(1e-9, max((r["wall_s"] for r in steps.values()), default=1e-9)), 3),
        "mean_lag": round(sum(r["lag_mean"] for r in steps.values()) / max(1, len(steps)), 3),
        "curve": [{"version": r["version"], "wall_s": r.get("wall_s"), "heldout_acc": r["heldout_acc"]} for r in evals],
    }
    (root / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
