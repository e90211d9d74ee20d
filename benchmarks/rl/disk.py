"""Disk use of a long run: the rollouts directory as the trainer goes, with the pruning of trained steps
(``rl.keep_rollout_steps``, default 2) against keeping every step (``-1``, what the trainer did before).

Runs the main config in local mode (trusted workers, no protocol) for ``--steps`` trainer steps and samples the
size of ``rollouts/`` (bytes, files) whenever the trainer commits a version; prints one JSON line with the sizes
at ``--at`` and at the end, for the default and (with ``--baseline``) for keep-everything, measured in the same
invocation.

    python benchmarks/rl/disk.py --steps 1000 --at 200 [--baseline]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

from swarmrl.config import load_config
from swarmrl.job import RunConfig
from swarmrl.job.launch import launch
from swarmrl.rundir import RunLayout


def usage(d: Path) -> tuple[int, int]:
    size = files = 0
    for root, _, names in os.walk(d):
        for n in names:
            try:
                size += os.stat(os.path.join(root, n)).st_size
                files += 1
            except FileNotFoundError:  # pruned meanwhile
                pass
    return size, files


def one(steps: int, at: int, keep: int, run_dir: Path, extra: list[str]) -> dict:
    cfg = load_config(RunConfig, "configs/run.toml", ["mode=\"local\"", f"rl.steps={steps}", f'rl.run_dir="{run_dir}"',
                                                      f"rl.keep_rollout_steps={keep}", "rl.eval.every_steps=0",
                                                      *extra])
    layout = RunLayout(run_dir)
    samples: dict[int, tuple[int, int]] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                v = int(layout.latest_file.read_text().strip())
            except (OSError, ValueError):
                v = -1
            if v >= 0 and v not in samples:
                samples[v] = usage(layout.rollouts)
            stop.wait(0.2)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    t0 = time.monotonic()
    summary = launch(cfg, progress=lambda m: print(m, file=sys.stderr))
    stop.set()
    t.join()
    end = usage(layout.rollouts)
    near = min(samples, key=lambda v: abs(v - at)) if samples else None
    big = max(samples.values(), default=(0, 0))
    return {"keep_rollout_steps": keep, "steps": summary["steps"], "wall_s": round(time.monotonic() - t0, 1),
            f"bytes_at_{at}": samples[near][0] if near is not None else None, "sampled_version": near,
            "bytes_end": end[0], "files_end": end[1], "bytes_max": big[0],
            "heldout_acc_final": summary["heldout_acc_final"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--at", type=int, default=200)
    ap.add_argument("--out", default="runs/bench_disk")
    ap.add_argument("--baseline", action="store_true", help="also run with every step kept (keep_rollout_steps=-1)")
    ap.add_argument("--set", action="append", default=[], help="extra RunConfig overrides")
    a = ap.parse_args()
    out = Path(a.out)
    res = {"default": one(a.steps, a.at, 2, out / "default", a.set)}
    if a.baseline:
        res["keep_all"] = one(a.steps, a.at, -1, out / "keep_all", a.set)
    d = res["default"]
    line = {"end_over_at": round(d["bytes_end"] / max(1, d[f"bytes_at_{a.at}"] or 1), 3), **{
        f"{k}_{f}": v for k, r in res.items() for f, v in r.items()}}
    print(json.dumps(line))


if __name__ == "__main__":
    main()
