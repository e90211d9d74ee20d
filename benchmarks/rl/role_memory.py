"""The trainer role's memory and update time on a run config, as a user runs it: ``swarmrl run -c CONFIG --local``
for ``--steps`` steps with an evaluation of 64 held-out items every ``--eval-every`` steps, the trainer's own peak
resident size (``VmHWM`` of the pid in ``RUN_DIR/pids.json``, polled twice a second to the end of the process, so the
final evaluation and the last commit count) and its median update time (``train_s`` of its step records).

Each config runs with its shipped settings and, with ``--float32``, once more with float32 AdamW moments and
gradients and no activation checkpointing (what the shipped memory settings are weighed against). Runs go one after
another; each run dir is a temporary directory, deleted after. Ends with one JSON line per run.

    python benchmarks/rl/role_memory.py --configs configs/smollm2.toml,configs/smollm2_chain_sum.toml --float32
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from swarmrl.utils.procs import child_env, stop_process

FLOAT32 = ["rl.optim.state_dtype=\"float32\"", "rl.optim.grad_dtype=\"float32\"",
           "rl.optim.activation_checkpointing=false"]


def _hwm_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def run_one(config: str, overrides: list[str], steps: int, eval_every: int, label: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="role_memory_") as tmp:
        run_dir = Path(tmp) / "run"
        sets = [f"rl.run_dir={run_dir}", f"rl.eval.every_steps={eval_every}", "final_eval_n=64", *overrides]
        cmd = [sys.executable, "-m", "swarmrl", "run", "-c", config, "--local", "--steps", str(steps)]
        for s in sets:
            cmd += ["--set", s]
        peak = {"kb": 0}
        done = threading.Event()

        def poll() -> None:
            pid = None
            while not done.is_set():
                if pid is None:
                    try:
                        pid = int(json.loads((run_dir / "pids.json").read_text())["trainer"])
                    except (OSError, ValueError, KeyError):
                        pid = None
                if pid is not None:
                    peak["kb"] = max(peak["kb"], _hwm_kb(pid) or 0)
                time.sleep(0.5)

        t = threading.Thread(target=poll, daemon=True)
        t.start()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                             env=child_env(os.environ))
        try:
            rc = p.wait()
        finally:
            stop_process(p)
            done.set()
            t.join()
        recs = [json.loads(line) for line in (run_dir / "metrics" / "trainer.jsonl").read_text().splitlines()]
    steps_ = [r for r in recs if r.get("train_s") is not None]
    return {"config": config, "settings": label, "rc": rc, "steps": len(steps_),
            "trainer_peak_mb": round(peak["kb"] / 1024), "update_s_median": round(statistics.median(
                r["train_s"] for r in steps_), 2) if steps_ else None,
            "eval_s": [r["eval_s"] for r in steps_ if r.get("eval_s")]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="configs/smollm2.toml")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--float32", action="store_true", help="also run each config in float32 without checkpointing")
    a = ap.parse_args()
    for config in a.configs.split(","):
        variants = [("shipped", [])] + ([("float32", FLOAT32)] if a.float32 else [])
        for label, overrides in variants:
            print(json.dumps(run_one(config, overrides, a.steps, a.eval_every, label)), flush=True)


if __name__ == "__main__":
    main()
