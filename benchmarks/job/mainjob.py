"""The main job (``swarmrl run`` with ``configs/run.toml``, what ``scripts/run.sh`` runs) timed and scored, for
one checkout or as a before/after of two checkouts run alternately in one sitting.

    python benchmarks/job/mainjob.py                          # this checkout, 1 run
    python benchmarks/job/mainjob.py --tree /work/old --tree . --pairs 3 --warmstart runs/warmstart

Each run starts from the same warm-start model (``--warmstart``, copied to each tree's ``runs/warmstart``, so the
warm start is reused and not part of the time), with the tree's own code (``PYTHONPATH``) and default config.
Prints the warm start's own figures (SFT steps, training seconds, held-out accuracy), then one JSON line per run (RL wall time, held-out accuracy before and after on the run's 512 items, validated
submissions, trainer wait) and then per tree: median wall time, mean final accuracy with its standard error over
runs and the binomial standard error of one run; with two trees, the ratio of their median times
(second / first) and the difference of their mean final accuracies.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from swarmrl.utils.procs import child_env


def one_run(tree: Path, warmstart: Path | None, extra: list[str], timeout_s: float) -> dict:
    if warmstart is not None and warmstart.resolve() != (tree / "runs" / "warmstart").resolve():
        shutil.rmtree(tree / "runs" / "warmstart", ignore_errors=True)
        shutil.copytree(warmstart, tree / "runs" / "warmstart")
    # child_env: the run (and through it its roles) dies with this benchmark, however this one ends
    env = child_env({**os.environ, "PYTHONPATH": str(tree)})
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "swarmrl", "run", *extra], cwd=tree, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout_s)
    total = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{tree}: swarmrl run exited {proc.returncode}: {proc.stderr[-2000:]}")
    s = json.loads((tree / "runs" / "rl" / "summary.json").read_text())
    nodes = (s.get("swarm") or {}).get("nodes", {})
    return {"tree": str(tree), "wall_s": s["wall_s"], "process_s": round(total, 1), "steps": s["steps"],
            "acc_initial": s["heldout_acc_initial"], "acc_final": s["heldout_acc_final"], "n": s["heldout_n"],
            "accepted": sum(n.get("accepted", 0) for n in nodes.values()),
            "rejected": sum(n.get("rejected", 0) for n in nodes.values()),
            "trainer_wait_frac": s.get("trainer_wait_frac")}


@contextlib.contextmanager
def held(lock: Path | None):
    """An exclusive flock on ``lock`` while a run goes (other benchmarks taking it wait), or nothing."""
    if lock is None:
        yield
        return
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def summarize(rows: list[dict]) -> dict:
    accs = [r["acc_final"] for r in rows]
    n = rows[0]["n"]
    mean = statistics.fmean(accs)
    return {"runs": len(rows), "median_wall_s": statistics.median(r["wall_s"] for r in rows),
            "walls_s": [r["wall_s"] for r in rows], "acc_initial": rows[0]["acc_initial"],
            "acc_final_mean": round(mean, 4), "acc_final_runs": accs,
            "se_over_runs": round(statistics.stdev(accs) / math.sqrt(len(accs)), 4) if len(accs) > 1 else None,
            "se_binomial_one_run": round(math.sqrt(mean * (1 - mean) / n), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", type=Path, help="checkout to run (repeat for a before/after)")
    ap.add_argument("--pairs", type=int, default=1, help="runs per tree, alternating between trees")
    ap.add_argument("--warmstart", type=Path, default=None, help="warm-start model dir used by every run")
    ap.add_argument("--timeout-s", type=float, default=1800.0)
    ap.add_argument("--lock", type=Path, default=None, help="flock this file during each run (a shared machine)")
    ap.add_argument("extra", nargs="*", help="arguments after -- go to swarmrl run")
    a = ap.parse_args()
    trees = [t.resolve() for t in (a.tree or [Path(".")])]
    ws = (a.warmstart or trees[0] / "runs" / "warmstart") / "summary.json"
    if ws.is_file():  # the warm start every run starts from (made by the first `swarmrl run` or scripts/run.sh)
        w = json.loads(ws.read_text())
        print(json.dumps({"warmstart": {k: w.get(k) for k in ("steps", "train_s", "final_heldout_acc")}}), flush=True)
    rows: dict[Path, list[dict]] = {t: [] for t in trees}
    for i in range(a.pairs):
        for t in (trees if i % 2 == 0 else trees[::-1]):  # ABBA...: neither tree always runs first
            with held(a.lock):
                r = one_run(t, a.warmstart, a.extra, a.timeout_s)
            rows[t].append(r)
            print(json.dumps(r), flush=True)
    sums = {str(t): summarize(rs) for t, rs in rows.items()}
    out: dict = {"summary": sums}
    if len(trees) == 2:
        a_, b_ = (sums[str(t)] for t in trees)
        out["wall_ratio_second_over_first"] = round(b_["median_wall_s"] / a_["median_wall_s"], 3)
        out["acc_diff_second_minus_first"] = round(b_["acc_final_mean"] - a_["acc_final_mean"], 4)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
